"""What every evaluation task has: a name, its command and results file, and how a sweep job runs it.

Adding a task is one file in this package (plus its test): a subclass of `EvalTask` decorated with
`posenc_cli.evaluation.tasks.register`, whose `evaluate_job` runs the shared loop `evaluation.loop.measure` with
three things of its own:

1. a typed entry: a frozen dataclass subclassing `loop.Entry`, its fields in the order of the stored JSON keys
   (`to_json` is what the results file holds), with at least `length`, `status` ("ok" or "n/a"), `reason` and
   `checkpoint` (`results.checkpoint_identity(run.meta)`);
2. the cell plan: an iterable of groups of planned entries (status "n/a"), each group measured by one call;
3. `key(entry_json) -> tuple`, ending with `*results.checkpoint_key(entry_json)`, and the measuring function
   `group -> entries` (`dataclasses.replace(entry, status="ok", ...)`, or a `reason`).

Sketch (`passkey.evaluate_passkey_run` and `perplexity.evaluate_run` are the full examples)::

    @register
    class MyTask(EvalTask):
        name, command, results_file = "mine", "eval-mine", Path("eval") / "mine.json"

        @classmethod
        def evaluate_job(cls, run, cfg, *, device, progress=None):
            check_not_training(run.path)                     # posenc_cli.evaluation.perplexity
            train_length, base_length = run.meta.lengths(run.config)   # posenc_cli.run.meta
            checkpoint = checkpoint_identity(run.meta)
            plan = ([MyEntry(length=n, ..., checkpoint=checkpoint)] for n, _ in plan_lengths(cfg.eval, base_length))
            header = results_header(run.path.name, run.scheme_label, train_length, base_length)
            done = measure(run.path / cls.results_file, cls.command, header, checkpoint, plan, measure_one, key=key)
            return {**done.header, "path": str(run.path), "reused": done.reused, "entries": done.entries}

`EvalTask.load_results(run_dir)` reads any task's stored doc (the one reader, `results.read_results_file`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from posenc_cli.evaluation.results import read_results_file

if TYPE_CHECKING:
    import torch

    from posenc_cli.config import Config
    from posenc_cli.run.load import LoadedRun

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

    @classmethod
    def load_results(cls, run_dir: Path | str) -> dict[str, Any] | None:
        """The stored results doc of this task in `run_dir`; None when absent, `CheckpointError` when unreadable."""
        return read_results_file(Path(run_dir) / cls.results_file, cls.command)
