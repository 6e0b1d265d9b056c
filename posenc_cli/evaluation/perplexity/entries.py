"""The typed entries of `eval/extrapolate.json`, written by `posenc eval-extrapolate` and read back.

An entry's fields, in order, are the keys of its stored JSON object (`loop.Entry.to_json`); `ENTRY_FIELDS` and
`STREAMING_FIELDS` are derived from the dataclasses, never listed by hand. Stored objects are read back as dicts;
`read_entry` in tests/evaluation/test_longppl.py turns them into the dataclasses, so every stored key stays a field
(keys an older posenc did not write take their defaults: no `positions`, sequential; a streaming entry without `decode`
was measured by re-encoding, "recompute"). LongPPL's fields (`longppl`, `key_tokens`, `longppl_evaluator`;
`evaluation.longppl`) are written only when it was measured on an evaluator's key tokens: an entry without them did not
measure it, one with `key_tokens` 0 and `longppl` None had no key token (at L <= the evaluator's training length by
construction). `longppl_evaluator` names the key set: {"run", "path", "checkpoint", "keys" (`longppl.keys_id`)}, plus
"unavailable" (why) where the evaluator cannot read the length. An entry stored by an older posenc with `longppl` and
`key_tokens` but no `longppl_evaluator` was scored on its own, self-chosen key tokens: it is read as it is, never shown
as LongPPL, and measured again when LongPPL is asked for."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from posenc_cli import __version__
from posenc_cli.evaluation.loop import Entry
from posenc_cli.evaluation.results import BEYOND_SCHEME, NON_FINITE, OK, SEQUENTIAL
from posenc_cli.evaluation.streaming import STREAMING_DECODE

__all__ = [
    "ENTRY_FIELDS",
    "LONGPPL_FIELDS",
    "STREAMING_FIELDS",
    "ExtrapolateEntry",
    "StreamingEntry",
    "filled",
]

# written only when LongPPL was measured (see the module docstring)
LONGPPL_FIELDS = ("longppl", "key_tokens", "longppl_evaluator")


@dataclass(frozen=True, kw_only=True)
class ExtrapolateEntry(Entry):
    """One length of `eval/extrapolate.json`; the fields in the order of the stored keys. `stride` is None for
    nonoverlap, the target size for fixed-target; `tokens` the scored tokens (0: no window fits); `data` the corpus
    {name, fingerprint}; `positions` the position ids fed (`Positions.to_json`); `status` one of
    `results.CellStatus`; `longppl` and `key_tokens` LongPPL over the cell's key tokens and their count, chosen by
    the evaluator `longppl_evaluator` names (None: not measured, and none of the three keys is stored)."""

    protocol: str
    stride: int | None
    length: int
    multiple: float
    tokens: int
    dtype: str
    data: dict[str, str]
    positions: dict[str, Any] = field(default_factory=lambda: dict(SEQUENTIAL))
    status: str = BEYOND_SCHEME  # planned; measuring sets the state (`results.CellStatus`)
    reason: str | None = None
    ppl: float | None = None
    nll: float | None = None
    bpb: float | None = None
    longppl: float | None = None
    key_tokens: int | None = None
    longppl_evaluator: dict[str, Any] | None = None
    per_position: list[float] = field(default_factory=list)
    posenc_version: str = __version__
    created: str = ""  # stamped by the loop, as the checkpoint
    checkpoint: dict[str, Any] = field(default_factory=dict)
    device: str

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        if self.longppl_evaluator is None:  # LongPPL not measured: no keys, as in entries from before it was
            for name in LONGPPL_FIELDS:
                out.pop(name)
        return out


@dataclass(frozen=True, kw_only=True)
class StreamingEntry(ExtrapolateEntry):
    """An entry of the streaming protocol: `stride` is the block size, `tokens` every token of the streams, and the
    cache's recent `window` and `sinks` (part of the entry's key) follow the other fields. `decode` (in the key too)
    says how the cache was read: "kv-cache", StreamingLLM's K/V kept as first computed (`evaluation.streaming`);
    entries without it were measured by re-encoding the kept tokens per block and are measured again."""

    window: int
    sinks: int
    decode: str = STREAMING_DECODE


ENTRY_FIELDS = tuple(f.name for f in fields(ExtrapolateEntry))
STREAMING_FIELDS = tuple(f.name for f in fields(StreamingEntry))


def filled(entry: ExtrapolateEntry, result: dict[str, Any]) -> ExtrapolateEntry:
    """`entry` measured: "ok" with the scores of `result` (`measuring.evaluate_model`'s keys, LongPPL's when it
    holds "longppl_evaluator"), or "non_finite" when the loss overflowed."""
    nll = result["nll"]
    if not math.isfinite(nll) or not math.isfinite(result["ppl"]):
        reason = f"non-finite loss (mean NLL {nll})"
        return replace(entry, status=NON_FINITE, reason=reason, nll=nll if math.isfinite(nll) else None)
    return replace(
        entry,
        status=OK,
        tokens=result["tokens"],
        ppl=result["ppl"],
        nll=nll,
        bpb=result["bpb"],
        longppl=result.get("longppl"),
        key_tokens=result.get("key_tokens"),
        longppl_evaluator=result.get("longppl_evaluator"),
        per_position=[round(v, 6) for v in result["per_position"]],
    )
