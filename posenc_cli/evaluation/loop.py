"""The one measure loop every evaluation task runs (`evaluate`), and the typed entries it stores.

A task (`Task`: `posenc_cli.evaluation.tasks.base.EvalTask`, one file each under `evaluation/tasks/`) is an object
holding one loaded run and its settings, with three methods the loop calls in a straight line:

- `task.plan()`: an iterable of groups, each a sequence of planned `Entry`s measured by one call. A group of one is
  a cell on its own (eval-extrapolate's lengths); a larger group shares its work (eval-passkey decodes every depth of
  a length in one batch). The plan is consumed lazily, so each entry's `created` is the moment its group came up;
- `task.key(entry_json) -> tuple`: two entries measure the same cell when their keys agree; the key must include the
  checkpoint (`results.checkpoint_key`), so a run trained further is measured again;
- `task.measure(group) -> entries`: the group's entries measured (same order), each `entry.measured(...)` or
  `entry.not_measured(reason)`.

The loop stamps what every entry shares (`COMMON_FIELDS`): the checkpoint measured (`results.checkpoint_identity`)
and the moment its group came up, on the planned entries; the status and reason come from `measure`, the posenc
version from the entry's default. For each group, in plan order: reuse the stored entries when every cell of the
group is stored under its key (unless `force`, or a stored entry is not `task.reusable`: one that lacks a
measurement asked for now), else measure the group and merge it into the results file under its lock
(`results.update_results_file`) right away, so a kill loses at most one group and another evaluation of the same run
writing at the same time keeps its cells. `store=False` writes nothing. Storage that refuses writes (read-only,
full) stops the writing but not the measuring when the task's `unwritable` is "report" (the reason is returned as
`not_saved`), and raises when it is "raise".

Entries are frozen dataclasses (`Entry`); their fields, in order, are the keys of the stored JSON object, so
`to_json` writes exactly what the results file holds. Stored entries are read back as plain dicts (older files may
lack newer keys), through the one reader `results.read_results_file`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from posenc_cli.errors import CheckpointError, disk_error_message, is_disk_error
from posenc_cli.evaluation.results import (
    checkpoint_identity,
    new_results_doc,
    read_results_file,
    update_results_file,
)
from posenc_cli.run.interrupts import run_is_locked

__all__ = [
    "COMMON_FIELDS",
    "Entry",
    "Measured",
    "Task",
    "check_not_training",
    "evaluate",
    "measure",
    "results_header",
]

# The fields of every entry: stamped by the loop (checkpoint, created), set by `measure` (status, reason) or left at
# their defaults (posenc_version). Each entry class declares them where its JSON object has them.
COMMON_FIELDS = ("checkpoint", "status", "reason", "posenc_version", "created")

E = TypeVar("E", bound="Entry")


@dataclass(frozen=True, kw_only=True)
class Entry:
    """A stored result entry; subclasses declare their fields (`COMMON_FIELDS` among them) in the order of the JSON
    object's keys."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def measured(self: E, **values: Any) -> E:
        """This cell measured: status "ok" with `values`."""
        return dataclasses.replace(self, status="ok", **values)

    def not_measured(self: E, reason: str, status: str = "n/a", **values: Any) -> E:
        """This cell not measured, and why (`status` one of `results.CellStatus`)."""
        return dataclasses.replace(self, status=status, reason=reason, **values)


class Task(Protocol):
    """What the loop needs of a task (`evaluation.tasks.base.EvalTask` is the one implementation): its loaded `run`
    (path, meta), results file and command, and the methods of the module docstring."""

    run: Any
    command: ClassVar[str]
    results_file: ClassVar[Path]
    unwritable: ClassVar[Literal["report", "raise"]]

    def header(self) -> dict[str, Any]: ...
    def plan(self) -> Iterable[Sequence[Entry]]: ...
    def measure(self, group: Sequence[Entry]) -> Sequence[Entry]: ...
    def key(self, entry: dict[str, Any]) -> tuple[Any, ...]: ...
    def reusable(self, stored: dict[str, Any]) -> bool: ...


@dataclass(frozen=True)
class Measured:
    """What `measure` did: the results doc's header (every key but `entries`), this call's entries in plan order
    (stored ones as read, new ones as written), how many were reused, and why nothing was saved (None: saved, or
    `store=False`)."""

    header: dict[str, Any]
    entries: list[dict[str, Any]]
    reused: int
    not_saved: str | None = None

    def result(self, path: Path | str) -> dict[str, Any]:
        """The results doc restricted to this call's entries, plus "path", "reused" and "not_saved"."""
        out = dict(self.header)
        out.update(path=str(path), reused=self.reused, entries=self.entries, not_saved=self.not_saved)
        return out


def results_header(run: str, scheme: str, train_length: int, base_length: int) -> dict[str, Any]:
    """The keys of a results doc before its `entries`: schema_version, run, scheme, train_length, base_length."""
    header = new_results_doc(run, scheme, train_length, base_length)
    header.pop("entries")
    return header


def check_not_training(run_dir: Path) -> None:
    """Refuse to evaluate a run whose trainer holds its run lock: its weights are about to change.

    A stopped run (interrupted, or trained to its last step) is evaluated as it stands; its cells are keyed by that
    checkpoint, so training it further makes them stale (measured again) instead of wrong.
    """
    if run_is_locked(run_dir):
        raise CheckpointError(f"{run_dir} is being trained by another process; evaluate it once training has stopped")


def evaluate(task: Task, *, force: bool = False, store: bool = True) -> dict[str, Any]:
    """Reuse or measure every group of `task.plan()` for its run and store them in `<run>/<task.results_file>`; the
    results doc restricted to this call's entries (`Measured.result`)."""
    return measure(task, force=force, store=store).result(task.run.path)


def measure(task: Task, *, force: bool = False, store: bool = True) -> Measured:
    """The loop of the module docstring on one task; what it did (`Measured`)."""
    path = Path(task.run.path) / task.results_file
    checkpoint = checkpoint_identity(task.run.meta)
    header = task.header()
    doc = read_results_file(path, task.command) or {**header, "entries": []}
    doc.update(header)  # --force recomputes this call's cells but still keeps the other stored entries
    stored = {task.key(e): e for e in doc["entries"]}
    selected: list[dict[str, Any]] = []
    reused = 0
    not_saved: str | None = None
    for planned in task.plan():
        group = stamped(planned, checkpoint)
        keys = [task.key(e.to_json()) for e in group]
        if not force and all(k in stored and task.reusable(stored[k]) for k in keys):
            selected += [stored[k] for k in keys]
            reused += len(keys)
            continue
        cells = [e.to_json() for e in task.measure(group)]
        if store and not_saved is None:
            try:
                update_results_file(path, task.command, header, cells, key=task.key, checkpoint=checkpoint)
            except OSError as e:
                if task.unwritable == "raise" or not is_disk_error(e):
                    raise
                not_saved = disk_error_message(e)
        selected += cells
    out = {k: v for k, v in doc.items() if k != "entries"}
    return Measured(header=out, entries=selected, reused=reused, not_saved=not_saved)


def stamped(group: Sequence[E], checkpoint: dict[str, Any]) -> list[E]:
    """The planned entries of a group that has come up, with the checkpoint measured and the moment (UTC, seconds)."""
    now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    return [dataclasses.replace(e, checkpoint=dict(checkpoint), created=now) for e in group]
