"""Which stored LongPPL cells a comparison shows: those scored on one evaluator's key tokens (`evaluation.longppl`).

A cell's `longppl_evaluator` names the key set it was scored on (the evaluator's run name and checkpoint). A
comparison in LongPPL shows one evaluator's cells only: the one asked for (`evaluator_checkpoint` of a run
directory), else the one every stored cell agrees on; cells of another evaluator, cells where the evaluator cannot
read the length, and cells an older posenc scored on their own, self-chosen key tokens (`longppl` without
`longppl_evaluator`) lose their LongPPL fields here and show as not measured (n/m), never as a value.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from posenc_cli.analysis.rows import RunRecord
from posenc_cli.errors import UserError
from posenc_cli.evaluation.results import checkpoint_key
from posenc_cli.run.meta import is_run_dir, read_meta

__all__ = ["LONGPPL_KEYS", "evaluator_checkpoint", "evaluators_of", "keyed_records"]

LONGPPL_KEYS = ("longppl", "key_tokens", "longppl_evaluator")  # an entry's LongPPL fields


def evaluator_checkpoint(given: str | Path) -> tuple[Any, Any]:
    """(step, weights sha256) of the evaluator run directory `given`; a one-line UserError when it is none."""
    path = Path(given)
    if not path.is_dir():
        raise UserError(f"--longppl-evaluator {given}: no such directory")
    if not is_run_dir(path):
        raise UserError(f"--longppl-evaluator {given}: not a posenc run directory (no meta.json of kind posenc-run)")
    meta = read_meta(path)
    return meta.get("step"), (meta.get("files") or {}).get("model.safetensors")


def _scored_by(entry: dict[str, Any]) -> tuple[Any, Any] | None:
    """The evaluator checkpoint whose key tokens scored `entry`; None for an entry without a usable LongPPL."""
    stamp = entry.get("longppl_evaluator")
    if not isinstance(stamp, dict) or stamp.get("unavailable"):
        return None
    return checkpoint_key(stamp)


def evaluators_of(records: list[RunRecord]) -> dict[tuple[Any, Any], str]:
    """The evaluators whose key tokens scored some stored cell: checkpoint -> run name, in order of appearance."""
    out: dict[tuple[Any, Any], str] = {}
    for record in records:
        for entry in record.entries:
            if (key := _scored_by(entry)) is not None:
                out.setdefault(key, str(entry["longppl_evaluator"].get("run")))
    return out


def keyed_records(records: list[RunRecord], evaluator: str | Path | None = None) -> list[RunRecord]:
    """`records` with only the LongPPL cells of one evaluator: `evaluator` (a run directory), else the one every
    scored cell agrees on; a UserError (one line) when the cells were scored by several and none was chosen."""
    if evaluator is not None:
        chosen = evaluator_checkpoint(evaluator)
    else:
        found = evaluators_of(records)
        if len(found) > 1:
            names = ", ".join(found.values())
            raise UserError(
                f"LongPPL cells were scored on the key tokens of {len(found)} evaluators ({names}); "
                "choose one with --longppl-evaluator RUN"
            )
        chosen = next(iter(found), None)

    def keep(entry: dict[str, Any]) -> dict[str, Any]:
        if chosen is not None and _scored_by(entry) == chosen:
            return entry
        return {k: v for k, v in entry.items() if k not in LONGPPL_KEYS}

    return [dataclasses.replace(r, entries=[keep(e) for e in r.entries]) for r in records]
