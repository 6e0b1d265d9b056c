"""What every evaluation task has: a name, its command and results file, and how a sweep job runs it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from posenc_cli.checkpoint import LoadedRun
    from posenc_cli.config import Config

Progress = Any  # Callable[[str, int, int], None] | None: (description, done, total)


class EvalTask:
    """One registered evaluation: `posenc <command>` stores its cells in `<run>/<results_file>`.

    `profiled_per_length`: a sweep job's profile books this task's time per length through the progress callback
    (the FLOPs of each length too); otherwise the task is timed as one phase named after it.
    """

    name: ClassVar[str]
    command: ClassVar[str]
    results_file: ClassVar[Path]
    profiled_per_length: ClassVar[bool] = False

    @classmethod
    def evaluate_job(
        cls, run: LoadedRun, cfg: Config, *, device: torch.device, progress: Progress = None
    ) -> dict[str, Any]:
        """Measure (or reuse) the cells a sweep job with config `cfg` asks of this task on its loaded run."""
        raise NotImplementedError
