"""Planning a perplexity evaluation: which lengths, which windows, which precision, and the cells to measure.

Pure functions of the settings and the validation stream's size (no model, no forward): `plan_lengths` (the lengths
of a cell row), `resolve_stride` (tokens scored per window), `plan_windows` (window start offsets of one length,
`plan_fixed_target` for the fixed-target protocol), `no_window_status`/`no_window_reason` (a length with no window),
`resolve_dtype` (the precision actually used), `streaming_settings` (the streaming cache's window and sinks) and
`plan_cells` (the planned `entries.ExtrapolateEntry` of every length, in length order, as `loop.measure` takes them).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from posenc_cli.config import EvalConfig
from posenc_cli.errors import ConfigError
from posenc_cli.evaluation.perplexity.entries import ExtrapolateEntry, StreamingEntry
from posenc_cli.evaluation.results import SHORTER_THAN_TARGET, TOO_FEW_TOKENS, Protocol
from posenc_cli.evaluation.streaming import DEFAULT_BLOCK, default_window
from posenc_cli.run.device import cpu_has_fast_bf16

__all__ = [
    "CellContext",
    "no_window_reason",
    "no_window_status",
    "plan_cells",
    "plan_fixed_target",
    "plan_lengths",
    "plan_windows",
    "resolve_dtype",
    "resolve_stride",
    "streaming_settings",
]


def plan_lengths(cfg: EvalConfig, base_length: int) -> list[tuple[int, float]]:
    """(length, multiple of `base_length`) pairs in increasing length, duplicates dropped."""
    if cfg.abs_lengths is not None:
        pairs = [(int(n), int(n) / base_length) for n in cfg.abs_lengths]
    else:
        pairs = [(max(1, round(m * base_length)), float(m)) for m in cfg.lengths]
    seen: dict[int, float] = {}
    for length, multiple in pairs:
        seen.setdefault(length, round(multiple, 6))
    return sorted(seen.items())


def resolve_stride(protocol: Protocol, stride: int | None, length: int, base_length: int | None = None) -> int:
    """Scored tokens per window: L for nonoverlap; `stride` (default L/2, at most L) for sliding; for fixed-target
    the target size `stride` (default `base_length`, else L; not capped, a target longer than L fits no window);
    for streaming the block size (default `streaming.DEFAULT_BLOCK`)."""
    if protocol == "nonoverlap":
        return length
    if protocol == "streaming":
        return max(1, int(stride or DEFAULT_BLOCK))
    if protocol == "fixed-target":
        return max(1, int(stride if stride is not None else (base_length or length)))
    if stride is None:
        return max(1, length // 2)
    return max(1, min(int(stride), length))


def plan_fixed_target(n_stream: int, length: int, target: int, n_tokens: int) -> np.ndarray:
    """Start offsets of fixed-target windows, (n_windows,) int64, ascending; empty unless all of them fit.

    Window k predicts stream tokens e_k - L + 1..e_k and scores its last `target`, e_k = n_stream - 1 - k·target
    (k = 0..⌈n_tokens/target⌉ - 1): the scored tokens depend on the stream, target and n_tokens only, never on L.
    """
    n = max(1, math.ceil(n_tokens / target))
    ends = n_stream - 1 - target * np.arange(n - 1, -1, -1, dtype=np.int64)  # (n,) last predicted token
    starts = ends - length
    if target > length or len(starts) == 0 or starts[0] < 0:
        return np.zeros(0, dtype=np.int64)
    return starts


def no_window_status(protocol: Protocol, length: int, stride: int) -> str:
    """The state of a cell without a window: shorter than its fixed target, else a corpus too short for it."""
    return SHORTER_THAN_TARGET if protocol == "fixed-target" and stride > length else TOO_FEW_TOKENS


def no_window_reason(protocol: Protocol, n_stream: int, length: int, stride: int, n_tokens: int) -> str:
    """Why `plan_windows` found no window (the `reason` of a too_few_tokens or shorter_than_target entry)."""
    if protocol != "fixed-target":
        what = "stream" if protocol == "streaming" else "window"
        return f"validation split has {n_stream} tokens; one {what} needs {length + 1}"
    if stride > length:
        return f"shorter than the fixed target of {stride} tokens"
    need = length + 1 + stride * (max(1, math.ceil(n_tokens / stride)) - 1)
    return f"validation split has {n_stream} tokens; fixed-target windows of {length} need {need}"


def plan_windows(
    n_stream: int, length: int, stride: int, n_tokens: int, protocol: Protocol = "nonoverlap"
) -> np.ndarray:
    """Start offsets of the evaluation windows, (n_windows,) int64 (`plan_fixed_target` for fixed-target).

    A window at s reads inputs s..s+L-1 and predicts s+1..s+L, so it needs s + L + 1 <= n_stream. Windows advance
    by `stride` and each scores `stride` tokens; enough windows are taken to score at least `n_tokens` tokens
    (rounded up to whole windows), or as many as the stream holds. Empty when not even one window fits.
    """
    if protocol == "fixed-target":
        return plan_fixed_target(n_stream, length, stride, n_tokens)
    if protocol == "streaming":  # streams are the nonoverlap windows; `stride` is the block size inside each
        return plan_windows(n_stream, length, length, n_tokens)
    if n_stream < length + 1:
        return np.zeros(0, dtype=np.int64)
    available = (n_stream - length - 1) // stride + 1
    wanted = max(1, math.ceil(n_tokens / stride))
    return np.arange(min(available, wanted), dtype=np.int64) * stride


def resolve_dtype(dtype: str, precision: str, device: torch.device | None = None) -> str:
    """'auto' -> 'bf16' when the run trained in bf16 (`precision`, from its meta.json), else 'fp32'.

    Exception: on a CPU without fast bf16 matmuls (see `device.cpu_has_fast_bf16`; emulated bf16 can be tens of
    times slower) 'auto' evaluates a bf16-trained run in fp32. The entry records the dtype actually used.
    """
    if dtype == "auto":
        if precision != "bf16":
            return "fp32"
        if device is not None and device.type == "cpu":
            return "bf16" if cpu_has_fast_bf16() else "fp32"
        return "bf16"
    if dtype not in ("fp32", "bf16"):
        raise ConfigError(f"--dtype must be auto, fp32 or bf16, got {dtype!r}")
    return dtype


def streaming_settings(cfg: EvalConfig, base_length: int) -> dict[str, int] | None:
    """{"window", "sinks"} of the streaming protocol (window default: base length minus sinks, at least 1); None
    for the other protocols."""
    if cfg.protocol != "streaming":
        return None
    block = resolve_stride("streaming", cfg.stride, base_length)
    window = cfg.window if cfg.window is not None else default_window(base_length, cfg.sinks, block)
    return {"window": int(window), "sinks": int(cfg.sinks)}


@dataclass(frozen=True, kw_only=True)
class CellContext:
    """What every cell of one run's evaluation records besides its length: the precision used, the corpus
    {name, fingerprint}, the position ids fed (`Positions.to_json`) and the device (the loop stamps the checkpoint)."""

    dtype: str
    data: dict[str, str]
    positions: dict[str, Any]
    device: str


def plan_cells(
    cfg: EvalConfig, base_length: int, n_stream: int, context: CellContext
) -> Iterator[list[ExtrapolateEntry]]:
    """One group of one planned entry per length of `cfg` (not measured until `measure` sets its status), lazily, as
    `loop.measure` takes them. `tokens` is what the cell will score (0: no window fits)."""
    streaming = streaming_settings(cfg, base_length)
    kind = ExtrapolateEntry if streaming is None else partial(StreamingEntry, **streaming)
    for length, multiple in plan_lengths(cfg, base_length):
        wanted = cfg.target if cfg.protocol == "fixed-target" else cfg.stride
        stride = resolve_stride(cfg.protocol, wanted, length, base_length)
        n_windows = len(plan_windows(n_stream, length, stride, cfg.tokens, cfg.protocol))
        yield [
            kind(
                protocol=cfg.protocol,
                stride=stride if cfg.protocol != "nonoverlap" else None,  # fixed-target: the target size
                length=length,
                multiple=multiple,
                tokens=n_windows * (length if streaming is not None else stride),
                dtype=context.dtype,
                data=dict(context.data),
                positions=dict(context.positions),
                device=context.device,
            )
        ]
