"""`passkey`: greedy retrieval of a key hidden at a depth, per length × depth (`posenc eval-passkey`,
`posenc_cli.evaluation.passkey`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posenc_cli.evaluation import passkey
from posenc_cli.evaluation.tasks import register
from posenc_cli.evaluation.tasks.base import EvalTask, Progress

if TYPE_CHECKING:
    import torch

    from posenc_cli.config import Config
    from posenc_cli.run.load import LoadedRun


@register
class PasskeyTask(EvalTask):
    name = "passkey"
    command = "eval-passkey"
    results_file = passkey.PASSKEY_FILE

    @classmethod
    def evaluate_job(
        cls, run: LoadedRun, cfg: Config, *, device: torch.device, progress: Progress = None
    ) -> dict[str, Any]:
        """eval-passkey's defaults at the job's `eval.lengths` (multiples of the training length)."""
        return passkey.evaluate_passkey_run(
            run, passkey.PasskeyConfig(lengths=cfg.eval.lengths), device=device, progress=progress
        )
