"""`algorithmic`: exact match per algorithmic task × instance length (`posenc eval-algorithmic`,
`posenc_cli.evaluation.algorithmic`), for sweep jobs trained on `data=algorithmic`.

Its cells' `length` is an instance length (items, digits, terms: 1..2L), not a token count (`length_axis`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from posenc_cli.data.sources.algorithmic import AlgorithmicDataConfig
from posenc_cli.evaluation import algorithmic
from posenc_cli.evaluation.perplexity import check_not_training
from posenc_cli.evaluation.tasks import register
from posenc_cli.evaluation.tasks.base import EvalTask, Progress

if TYPE_CHECKING:
    import torch

    from posenc_cli.config import Config
    from posenc_cli.run.load import LoadedRun


@register
class AlgorithmicEvalTask(EvalTask):
    name = "algorithmic"
    command = algorithmic.COMMAND
    results_file = algorithmic.ALGORITHMIC_FILE
    length_axis: ClassVar[str] = "instance"  # cells are per instance length, not per token length

    @classmethod
    def evaluate_job(
        cls, run: LoadedRun, cfg: Config, *, device: torch.device, progress: Progress = None
    ) -> dict[str, Any]:
        """The job's `data=algorithmic` settings (its tasks, 1..data.eval_max_length or 2L, data.eval_examples); a
        job trained on other data has no algorithmic cells (a run being trained is refused either way)."""
        check_not_training(run.path)
        if not isinstance(cfg.data, AlgorithmicDataConfig):
            return {"path": str(run.path), "reused": 0, "entries": []}
        return algorithmic.evaluate_algorithmic_run(
            run, algorithmic.AlgorithmicEvalConfig(), device=device, progress=progress
        )
