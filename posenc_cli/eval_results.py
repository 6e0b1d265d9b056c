"""The results file of `posenc eval-extrapolate`: `eval/extrapolate.json` inside each run directory.

The file holds one doc (`new_results_doc`): schema_version, run, scheme, train_length, base_length and a list of
`entries`, one per measurement (protocol, stride, length, tokens, dtype, data fingerprint, status, ppl...). Two
entries measure the same thing when their `entry_key` agrees; `merge_entry` replaces a stored entry with the same key
(in place, keeping its position) and appends any other, so a new measurement keeps every other stored entry.
`pick_entries` selects the most recent matching entry per length, for compare/sweep code reading stored results.

A stored doc is read through `read_results_file`: an absent file is None, while invalid JSON, a doc without an
`entries` list or another schema_version raise `CheckpointError`. Writes are atomic (`fsutil.atomic_write_json`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from posenc_cli.errors import CheckpointError
from posenc_cli.fsutil import atomic_write_json

SCHEMA_VERSION = 1
RESULTS_FILE = Path("eval") / "extrapolate.json"
Protocol = Literal["nonoverlap", "sliding", "fixed-target"]

__all__ = [
    "RESULTS_FILE",
    "SCHEMA_VERSION",
    "entry_key",
    "load_results",
    "merge_entry",
    "new_results_doc",
    "pick_entries",
    "read_results_file",
    "results_path",
    "save_results",
]


def results_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / RESULTS_FILE


def new_results_doc(run: str, scheme: str, train_length: int, base_length: int) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "run": run,
        "scheme": scheme,
        "train_length": train_length,
        "base_length": base_length,
        "entries": [],
    }


def read_results_file(path: Path, what: str) -> dict[str, Any] | None:
    """A results file of `eval/` (`what` names its command); None when absent, CheckpointError when unreadable."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); delete it to start again") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise CheckpointError(f"{path} is not an {what} results file (no 'entries' list)")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise CheckpointError(f"{path}: schema_version {doc.get('schema_version')!r} is not {SCHEMA_VERSION}")
    return doc


def load_results(run_dir: Path | str, *, missing_ok: bool = False) -> dict[str, Any] | None:
    """The stored `eval/extrapolate.json` of a run; None when absent and `missing_ok`, else CheckpointError."""
    path = results_path(run_dir)
    doc = read_results_file(path, "eval-extrapolate")
    if doc is None and not missing_ok:
        raise CheckpointError(f"{path} does not exist; run `posenc eval-extrapolate {run_dir}` first")
    return doc


def save_results(run_dir: Path | str, doc: dict[str, Any]) -> Path:
    path = results_path(run_dir)
    atomic_write_json(path, doc)
    return path


def entry_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    """Two entries measure the same thing when these agree."""
    data = entry.get("data") or {}
    return (
        entry["protocol"],
        entry["stride"],
        entry["length"],
        entry["tokens"],
        entry["dtype"],
        data.get("fingerprint"),
    )


def merge_entry(doc: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """Replace the entry with the same key (in place, keeping its position) or append; returns `doc`."""
    key = entry_key(entry)
    entries = doc["entries"]
    for i, old in enumerate(entries):
        if entry_key(old) == key:
            entries[i] = entry
            return doc
    entries.append(entry)
    return doc


def pick_entries(
    doc: dict[str, Any],
    *,
    protocol: Protocol = "nonoverlap",
    stride: int | None = None,
    dtype: str | None = None,
    data_fingerprint: str | None = None,
) -> list[dict[str, Any]]:
    """One entry per length (the most recent) matching the filters, by increasing length.

    `stride` None matches any stride of a sliding protocol; for compare/sweep code reading stored results.
    """
    best: dict[int, dict[str, Any]] = {}
    for e in doc["entries"]:
        if e["protocol"] != protocol or (stride is not None and e["stride"] != stride):
            continue
        if dtype is not None and e["dtype"] != dtype:
            continue
        if data_fingerprint is not None and (e.get("data") or {}).get("fingerprint") != data_fingerprint:
            continue
        if e["length"] not in best or str(e.get("created", "")) >= str(best[e["length"]].get("created", "")):
            best[e["length"]] = e
    return [best[k] for k in sorted(best)]
