"""What every evaluation task is: one class with `plan`, `measure`, `key` and `summarise`.

Adding a task is one file in this package (plus its test): a subclass of `EvalTask` decorated with
`posenc_cli.evaluation.tasks.register`. An instance holds one loaded run and its settings (its `__init__` resolves
them: precision, lengths, sizes); the shared loop `evaluation.loop.evaluate(task)` calls

1. `plan()`: groups of planned entries, each a frozen dataclass subclassing `loop.Entry` whose fields, in the order of
   the stored JSON keys, include `loop.COMMON_FIELDS` (checkpoint, status, reason, posenc_version, created: the loop
   stamps the checkpoint and the time, so the plan leaves them at their defaults);
2. `key(entry_json) -> tuple`, ending with `*results.checkpoint_key(entry_json)`;
3. `measure(group) -> entries`: each `entry.measured(...)` or `entry.not_measured(reason)`.

The class answers the rest: `for_job` (the instance a sweep job with config `cfg` runs, or None when the job does not
run this task), `cell(entry)` and `current(entry)` (which stored cells a sweep or `compare` gathers: the latest per
cell, of the current generator) and `summarise(results, ...)` (what a sweep and `compare` print after the comparison
table, from the gathered result docs; None: nothing to add). A task registered this way is measured by a sweep job of
every data source naming it (`DataSource.tasks`), summarised by `posenc sweep` and `posenc compare`
(`api.task_summaries`) and listed by the API, with no other edit (`tests/evaluation/test_task_contract.py`).

Sketch (`tasks/passkey.py` is a full one of 120 lines)::

    @register
    class MyTask(EvalTask):
        name, command, results_file = "mine", "eval-mine", Path("eval") / "mine.json"

        def __init__(self, run, settings, *, device=None, progress=None):
            super().__init__(run, device=device, progress=progress)   # refuses a run being trained
            self.settings = settings

        @classmethod
        def for_job(cls, run, cfg, *, device, progress=None):
            return cls(run, MySettings(lengths=cfg.eval.lengths), device=device, progress=progress)

        def plan(self):
            return ([MyEntry(length=n)] for n, _ in plan_lengths(self.settings, self.base_length))

        @staticmethod
        def key(e):
            return (e["length"], *checkpoint_key(e))

        def measure(self, group):
            return [e.measured(score=...) for e in group]

`EvalTask.load_results(run_dir)` reads any task's stored doc (the one reader, `results.read_results_file`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

from posenc_cli.evaluation.loop import Entry, check_not_training, evaluate, results_header
from posenc_cli.evaluation.results import read_results_file

if TYPE_CHECKING:
    from typing import Self

    from posenc_cli.config import Config
    from posenc_cli.run.load import LoadedRun

Progress = Callable[[str, int, int], None] | None  # (description, done, total)


@dataclass(frozen=True)
class Summary:
    """What a task adds after a sweep's or `compare`'s comparison table: the stored result docs it summarises (one
    per run, `analysis.task_results.stored_results`), the competence gate of each run × task (`evaluation.competence`)
    and the tables `report` draws from them (rich renderables the CLI prints)."""

    task: str
    results: list[dict[str, Any]]
    gates: list[dict[str, Any]] = field(default_factory=list)
    tables: list[Any] = field(default_factory=list)


class EvalTask:
    """One registered evaluation: `posenc <command>` stores its cells in `<run>/<results_file>`.

    `profiled_per_length`: a sweep job's profile books this task's time per length through the progress callback
    (the FLOPs of each length too); otherwise the task is timed as one phase named after it. `unwritable`: what a
    results file that cannot be written does (`loop`): "report" it as `not_saved`, or "raise". `summary_rank`: where
    its summary comes among the others (then by name).
    """

    name: ClassVar[str]
    command: ClassVar[str]
    results_file: ClassVar[Path]
    profiled_per_length: ClassVar[bool] = False
    unwritable: ClassVar[Literal["report", "raise"]] = "report"
    summary_rank: ClassVar[int] = 0

    def __init__(self, run: LoadedRun, *, device: str | torch.device | None = None, progress: Progress = None) -> None:
        check_not_training(run.path)
        self.run = run
        self.device = torch.device(device) if device is not None else next(run.model.parameters()).device
        self.progress = progress

    # -- what the loop calls -----------------------------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        """The results doc's keys before its entries; the run's scheme label (DroPE: "rope, dropped at k")."""
        train_length, base_length = self.run.meta.lengths(self.run.config)
        return results_header(self.run.path.name, self.run.scheme_label, train_length, base_length)

    def plan(self) -> Iterable[Sequence[Entry]]:
        """The planned entries, in groups each measured by one `measure` call (lazily: see `loop`)."""
        raise NotImplementedError

    def measure(self, group: Sequence[Entry]) -> Sequence[Entry]:
        """The group's entries measured, in the same order."""
        raise NotImplementedError

    @staticmethod
    def key(entry: dict[str, Any]) -> tuple[Any, ...]:
        """What a stored entry measured: two entries with equal keys are the same cell (the checkpoint included)."""
        raise NotImplementedError

    def reusable(self, stored: dict[str, Any]) -> bool:
        """Whether a stored entry of the same key can stand for the cell now (False: measure its group again)."""
        return True

    # -- what a sweep job, a sweep's summary and `compare` call --------------------------------------------------

    @classmethod
    def for_job(cls, run: LoadedRun, cfg: Config, *, device: torch.device, progress: Progress = None) -> Self | None:
        """The evaluation a sweep job with config `cfg` asks of this task on its loaded run; None: none."""
        raise NotImplementedError

    @classmethod
    def evaluate_job(
        cls, run: LoadedRun, cfg: Config, *, device: torch.device, progress: Progress = None
    ) -> dict[str, Any]:
        """Measure (or reuse) the cells a sweep job asks of this task (a run being trained is refused either way)."""
        check_not_training(run.path)
        task = cls.for_job(run, cfg, device=device, progress=progress)
        if task is None:
            return {"path": str(run.path), "reused": 0, "entries": []}
        return evaluate(task)

    @classmethod
    def cell(cls, entry: dict[str, Any]) -> tuple[Any, ...]:
        """Which cell a stored entry is, whatever its settings: a sweep's summary shows the latest entry per cell."""
        return (int(entry["length"]),)

    @classmethod
    def current(cls, entry: dict[str, Any]) -> bool:
        """Whether a stored entry of this task is shown by a summary (False: another task's, or an older
        generator's cells)."""
        return True

    @classmethod
    def summarise(
        cls, results: Sequence[dict[str, Any]], *, threshold: float | None = None, competence: float | None = None
    ) -> Summary | None:
        """What a sweep and `compare` print after the comparison table from the runs' stored docs of this task
        (`threshold`: a score threshold of the task's own, None: its default; `competence`: the competence gate's
        threshold, None: `report.gate.DEFAULT_COMPETENCE`); None: nothing to add."""
        return None

    @classmethod
    def load_results(cls, run_dir: Path | str) -> dict[str, Any] | None:
        """The stored results doc of this task in `run_dir`; None when absent, `CheckpointError` when unreadable."""
        return read_results_file(Path(run_dir) / cls.results_file, cls.command)
