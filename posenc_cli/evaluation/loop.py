"""The one measure loop every evaluation task runs, and the typed entries it stores.

A task (`posenc_cli.evaluation.tasks`, one file each) supplies three things and `measure` does the rest:

- the cell plan: an iterable of groups, each a sequence of planned `Entry`s (status "n/a") measured by one call.
  A group of one is a cell on its own (eval-extrapolate's lengths); a larger group shares its work (eval-passkey
  decodes every depth of a length in one batch). The plan is consumed lazily, so each entry's `created` is the
  moment its group came up;
- `key(entry_json) -> tuple`: two entries measure the same cell when their keys agree; the key must include the
  checkpoint (`results.checkpoint_key`), so a run trained further is measured again;
- `measure_group(group) -> entries`: the group's entries measured (same order), typically with
  `dataclasses.replace(entry, status="ok", ...)` or the reason it cannot be measured.

For each group, in plan order: reuse the stored entries when every cell of the group is stored under its key (unless
`force`, or a stored entry is not `reusable`: one that lacks a measurement asked for now), else measure the group
and merge it into the results file under its lock (`results.update_results_file`) right away, so a kill loses at
most one group and another evaluation of the same run writing at the same time keeps its cells. `store=False` writes
nothing. Storage that refuses writes (read-only, full) stops the writing but not the measuring when
`unwritable="report"` (the reason is returned as `not_saved`), and raises when `unwritable="raise"`.

Entries are frozen dataclasses (`Entry`); their fields, in order, are the keys of the stored JSON object, so
`to_json` writes exactly what the results file holds. Stored entries are read back as plain dicts (older files may
lack newer keys), through the one reader `results.read_results_file`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from posenc_cli.errors import disk_error_message, is_disk_error
from posenc_cli.evaluation.results import new_results_doc, read_results_file, update_results_file

__all__ = ["Entry", "Key", "Measured", "measure", "results_header"]

Key = Callable[[dict[str, Any]], tuple[Any, ...]]


@dataclass(frozen=True, kw_only=True)
class Entry:
    """A stored result entry; subclasses declare their fields in the order of the JSON object's keys."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Measured:
    """What `measure` did: the results doc's header (every key but `entries`), this call's entries in plan order
    (stored ones as read, new ones as written), how many were reused, and why nothing was saved (None: saved, or
    `store=False`)."""

    header: dict[str, Any]
    entries: list[dict[str, Any]]
    reused: int
    not_saved: str | None = None


def results_header(run: str, scheme: str, train_length: int, base_length: int) -> dict[str, Any]:
    """The keys of a results doc before its `entries`: schema_version, run, scheme, train_length, base_length."""
    header = new_results_doc(run, scheme, train_length, base_length)
    header.pop("entries")
    return header


def measure(
    path: Path,
    command: str,
    header: dict[str, Any],
    checkpoint: dict[str, Any],
    plan: Iterable[Sequence[Entry]],
    measure_group: Callable[[Sequence[Entry]], Sequence[Entry]],
    *,
    key: Key,
    force: bool = False,
    store: bool = True,
    unwritable: Literal["report", "raise"] = "report",
    reusable: Callable[[dict[str, Any]], bool] | None = None,
) -> Measured:
    """Reuse or measure every group of `plan` for the results file at `path` (`command` names it in errors); see
    the module docstring. `header` is `results_header(...)`, `checkpoint` the run's `checkpoint_identity`;
    `reusable(stored_entry)` False measures that entry's group again (None: every stored entry is reusable)."""
    doc = read_results_file(path, command) or {**header, "entries": []}
    doc.update(header)  # --force recomputes this call's cells but still keeps the other stored entries
    stored = {key(e): e for e in doc["entries"]}
    selected: list[dict[str, Any]] = []
    reused = 0
    not_saved: str | None = None
    for group in plan:
        keys = [key(e.to_json()) for e in group]
        if not force and all(k in stored and (reusable is None or reusable(stored[k])) for k in keys):
            selected += [stored[k] for k in keys]
            reused += len(keys)
            continue
        cells = [e.to_json() for e in measure_group(group)]
        if store and not_saved is None:
            try:
                update_results_file(path, command, header, cells, key=key, checkpoint=checkpoint)
            except OSError as e:
                if unwritable == "raise" or not is_disk_error(e):
                    raise
                not_saved = disk_error_message(e)
        selected += cells
    out = {k: v for k, v in doc.items() if k != "entries"}
    return Measured(header=out, entries=selected, reused=reused, not_saved=not_saved)
