"""`extrapolate`: perplexity at and beyond the training length (`posenc eval-extrapolate`, `posenc_cli.evaluate`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posenc_cli import evaluate
from posenc_cli.eval_results import RESULTS_FILE
from posenc_cli.tasks import register
from posenc_cli.tasks.base import EvalTask, Progress

if TYPE_CHECKING:
    import torch

    from posenc_cli.checkpoint import LoadedRun
    from posenc_cli.config import Config


@register
class ExtrapolateTask(EvalTask):
    name = "extrapolate"
    command = "eval-extrapolate"
    results_file = RESULTS_FILE
    profiled_per_length = True

    @classmethod
    def evaluate_job(
        cls, run: LoadedRun, cfg: Config, *, device: torch.device, progress: Progress = None
    ) -> dict[str, Any]:
        """The job's `eval` settings on the run's own validation split."""
        return evaluate.evaluate_run(run, cfg.eval, device=device, progress=progress)
