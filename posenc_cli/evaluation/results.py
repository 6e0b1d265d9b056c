"""The results file of `posenc eval-extrapolate`: `eval/extrapolate.json` inside each run directory.

The file holds one doc (`new_results_doc`): schema_version, run, scheme, train_length, base_length and a list of
`entries`, one per measurement (protocol, stride, length, tokens, dtype, data fingerprint, status, ppl...). Two
entries measure the same thing when their `entry_key` agrees; `update_results_file` replaces a stored entry with the
same key (in place, keeping its position) and appends any other, so a new measurement keeps every other stored entry.

A stored doc is read through `read_results_file`: an absent file is None, while invalid JSON, a doc without an
`entries` list or another schema_version raise `CheckpointError`. Writes are atomic (`fsutil.atomic_write_json`).

Every entry records the checkpoint it measured (`checkpoint_identity`: the run's step and the sha256 of its
model.safetensors from meta.json), and that identity is part of the key, so a run trained further is measured
again instead of reusing cells of its earlier weights. Writers go through `update_results_file`: under a lock next
to the file it re-reads what is on disk, drops entries of another checkpoint of the run, merges the new entries and
writes, so two evaluations of one run at once keep each other's cells. A length with no entry was not measured.

What a cell measured is in its key (`entry_key`): the corpus (`data.name` and `data.fingerprint`), the protocol and its
stride (and a streaming cache's `window` and `sinks`), the length, the scored-token budget, the precision (`dtype`),
the position ids fed (`positions`: sequential 0..T-1 or the run's randomized positions with their range and seed),
and the checkpoint. Entries from before a field was recorded are read as what they were: no `positions` is
sequential. `cell_group` is the part of the key that a table's row shares across lengths.

A cell's state is its `status` (`cell_status` also reads entries written before the states were told apart):
"ok" (measured); "n/a" (the scheme, or the run's position range, cannot read that many tokens: as every evaluation
writes it; streaming: also a layer's span the cache cannot honour, `streaming.SpanBeyondCache`); "too_few_tokens"
(the corpus is too short for one window at that length: a property of the data, not of the scheme);
"shorter_than_target" (fixed-target: a length shorter than its scored target); "non_finite" (the loss overflowed).
Every state but "ok" comes with its `reason` text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock, Timeout

from posenc_cli.errors import CheckpointError, UserError
from posenc_cli.fsutil import atomic_write_json
from posenc_cli.run.meta import RunMeta

SCHEMA_VERSION = 1
EXTRAPOLATE_FILE = Path("eval") / "extrapolate.json"
TASKS_FILE = Path("eval") / "tasks.json"  # every RULER-style retrieval task's cells (`tasks.retrieval`)
TASKS_COMMAND = "eval-tasks"
Protocol = Literal["nonoverlap", "sliding", "fixed-target", "streaming"]
CellStatus = Literal["ok", "n/a", "too_few_tokens", "shorter_than_target", "non_finite"]
OK: CellStatus = "ok"
BEYOND_SCHEME: CellStatus = "n/a"  # the scheme (or the run's randomized position range) cannot read the length
TOO_FEW_TOKENS: CellStatus = "too_few_tokens"  # the corpus holds no window of the length
SHORTER_THAN_TARGET: CellStatus = "shorter_than_target"  # fixed-target: the length is shorter than its target
NON_FINITE: CellStatus = "non_finite"  # the loss overflowed
SEQUENTIAL = {"mode": "sequential"}  # positions 0..T-1: what every entry without a `positions` field was fed
LOCK_TIMEOUT_S = 120.0  # a writer holds the lock only to read, merge and write one small file

__all__ = [
    "BEYOND_SCHEME",
    "EXTRAPOLATE_FILE",
    "NON_FINITE",
    "OK",
    "SCHEMA_VERSION",
    "SEQUENTIAL",
    "SHORTER_THAN_TARGET",
    "TASKS_COMMAND",
    "TASKS_FILE",
    "TOO_FEW_TOKENS",
    "cell_group",
    "cell_status",
    "checkpoint_identity",
    "corpus_key",
    "entry_key",
    "load_results",
    "new_results_doc",
    "positions_key",
    "read_results_file",
    "results_path",
    "update_results_file",
]


def results_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / EXTRAPOLATE_FILE


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


def entry_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    """Two entries measure the same thing when these agree: `cell_group` plus the length, the scored-token budget
    and the checkpoint."""
    return (*cell_group(entry), entry["length"], entry["tokens"], *checkpoint_key(entry))


def cell_group(entry: dict[str, Any]) -> tuple[Any, ...]:
    """What the cells of one table row share across lengths: the corpus (`corpus_key`), protocol, stride, a
    streaming cache's window and sinks, precision (`dtype`) and the position ids fed (`positions_key`). Cells of
    different groups measured different things and are never shown as one row."""
    # streaming: the cache's window and sinks, and how it was read (entries from before the KV cache re-encoded it)
    streaming = (
        (entry.get("window"), entry.get("sinks"), entry.get("decode", "recompute"))
        if entry["protocol"] == "streaming"
        else ()
    )
    return (
        *corpus_key(entry),
        entry["protocol"],
        entry["stride"],
        *streaming,
        entry["dtype"],
        *positions_key(entry),
    )


def corpus_key(entry: dict[str, Any]) -> tuple[str | None, str | None]:
    """(data name, data fingerprint) of the corpus an entry scored."""
    data = entry.get("data") or {}
    return data.get("name"), data.get("fingerprint")


def positions_key(entry: dict[str, Any]) -> tuple[str, int | None, int | None]:
    """(mode, range M, seed) of the position ids an entry fed: ("sequential", None, None) for 0..T-1, which is also
    what an entry from before the field was recorded was fed; ("random", M, seed) for sorted draws from [0, M)."""
    positions = entry.get("positions") or SEQUENTIAL
    if positions.get("mode", "sequential") == "sequential":
        return "sequential", None, None
    return str(positions["mode"]), positions.get("range"), positions.get("seed")


def cell_status(entry: dict[str, Any]) -> str:
    """The state of a stored cell (see the module docstring). Entries written before the states were told apart
    say "n/a" for all of them; their reason text tells which it was."""
    status = str(entry.get("status"))
    if status != BEYOND_SCHEME:
        return status
    reason = str(entry.get("reason") or "")
    if reason.startswith("validation split has"):
        return TOO_FEW_TOKENS
    if reason.startswith("shorter than the fixed target"):
        return SHORTER_THAN_TARGET
    if reason.startswith("non-finite loss"):
        return NON_FINITE
    return BEYOND_SCHEME


def checkpoint_identity(meta: RunMeta) -> dict[str, Any]:
    """What a cell measured: the run's step and the sha256 of its weights file, both from meta.json."""
    return {"step": meta.step, "model_sha256": meta.files.get("model.safetensors")}


def checkpoint_key(entry: dict[str, Any]) -> tuple[Any, Any]:
    """(step, weights sha256) of the checkpoint an entry measured; (None, None) for entries from before it was kept."""
    ckpt = entry.get("checkpoint") or {}
    return ckpt.get("step"), ckpt.get("model_sha256")


def update_results_file(
    path: Path,
    what: str,
    header: dict[str, Any],
    entries: Iterable[dict[str, Any]],
    *,
    key: Callable[[dict[str, Any]], tuple[Any, ...]],
    checkpoint: dict[str, Any],
) -> dict[str, Any]:
    """Merge `entries` into the results file at `path` (a new doc gets `header`); returns the doc written.

    Under a lock next to the file: re-read the file, drop entries of another checkpoint than `checkpoint` (the run
    was trained further since), replace entries with the same `key` in place or append, write atomically. Entries
    without a recorded checkpoint (older files) are kept; their key never matches a new entry.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    current = checkpoint_key({"checkpoint": checkpoint})
    try:
        with FileLock(path.parent / f".{path.name}.lock", timeout=LOCK_TIMEOUT_S):
            doc = read_results_file(path, what) or {"schema_version": SCHEMA_VERSION, **header, "entries": []}
            doc.update(header)
            kept = [e for e in doc["entries"] if checkpoint_key(e) in (current, (None, None))]
            position = {key(e): i for i, e in enumerate(kept)}
            for entry in entries:
                if key(entry) in position:
                    kept[position[key(entry)]] = entry
                else:
                    position[key(entry)] = len(kept)
                    kept.append(entry)
            doc["entries"] = kept
            atomic_write_json(path, doc)
    except Timeout as e:
        raise UserError(f"{path} stayed locked by another process for {LOCK_TIMEOUT_S:.0f} s; try again") from e
    return doc


def window_scores(pos_sum: Any, n_windows: int, stride: int, n_bytes: int) -> dict[str, Any]:
    """The scores of one evaluation length from the summed NLL per scored position `pos_sum` (a float64 tensor of
    `stride` positions, summed over `n_windows` windows) and the bytes the scored tokens stand for: token-weighted
    nll, ppl = exp(nll) (inf past overflow), bits per byte (None without byte counts), the mean loss per position."""
    scored_tokens = n_windows * len(pos_sum)
    total = float(pos_sum.sum())
    nll = total / scored_tokens
    return {
        "tokens": scored_tokens,
        "windows": n_windows,
        "stride": stride,
        "nll": nll,
        "ppl": math.exp(nll) if nll < 700 else math.inf,
        "bpb": total / (math.log(2) * n_bytes) if n_bytes > 0 else None,
        "bytes": n_bytes,
        "per_position": (pos_sum / n_windows).tolist(),
    }
