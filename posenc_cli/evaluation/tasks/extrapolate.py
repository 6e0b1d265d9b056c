"""`extrapolate`: perplexity at and beyond the training length (`posenc eval-extrapolate`,
`posenc_cli.evaluation.perplexity`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posenc_cli.evaluation import perplexity as evaluate
from posenc_cli.evaluation.results import EXTRAPOLATE_FILE
from posenc_cli.evaluation.tasks import register
from posenc_cli.evaluation.tasks.base import EvalTask, Progress

if TYPE_CHECKING:
    import torch

    from posenc_cli.config import Config
    from posenc_cli.run.load import LoadedRun


@register
class ExtrapolateTask(EvalTask):
    name = "extrapolate"
    command = "eval-extrapolate"
    results_file = EXTRAPOLATE_FILE
    profiled_per_length = True

    @classmethod
    def evaluate_job(
        cls, run: LoadedRun, cfg: Config, *, device: torch.device, progress: Progress = None
    ) -> dict[str, Any]:
        """The job's `eval` settings on the run's own validation split, fed the run's own positions (a job trained
        with `train.random_positions=M` is fed sorted draws from [0, M), as in training: `perplexity.run_positions`)."""
        return evaluate.evaluate_run(run, cfg.eval, device=device, progress=progress)
