"""Measuring one length: the forward passes over a cell's windows and the summed NLL per scored position.

`evaluate_model` scores the nonoverlap, sliding and fixed-target protocols (the streaming protocol's decoding is
`evaluation.streaming.evaluate_streaming`). For LongPPL (`evaluation.longppl`) it either finds a cell's key tokens,
as the evaluator (`key_tokens`: each candidate target scored again with the evaluator's training-length context),
or scores the model on the key tokens an evaluator chose (`score_keys`: stream indices of the targets). The
long-context pass is the same computation with or without either: the same forwards, the same fp32 log-softmax, the
same float64 sums.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from posenc_cli.errors import LengthBeyondScheme
from posenc_cli.evaluation.longppl import (
    KeyTokens,
    KeyTokenSum,
    candidate_positions,
    key_targets,
    short_context_nll,
    short_generator,
    target_indices,
)
from posenc_cli.evaluation.perplexity.planning import no_window_reason, plan_windows, resolve_stride
from posenc_cli.evaluation.positions import Positions
from posenc_cli.evaluation.results import Protocol, window_scores

__all__ = ["Progress", "evaluate_model"]

Progress = Callable[[str, int, int], None]  # (description, done, total)


def evaluate_model(
    model: nn.Module,
    tokens: np.ndarray,
    token_bytes: np.ndarray | None,
    *,
    length: int,
    protocol: Protocol = "nonoverlap",
    stride: int | None = None,
    n_tokens: int = 16384,
    batch_tokens: int = 16384,
    dtype: str = "fp32",
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    positions: Positions | None = None,
    key_tokens: KeyTokens | None = None,
    score_keys: np.ndarray | None = None,
) -> dict[str, Any]:
    """Score `model` ((B, T) int64 -> (B, T, V) logits) on windows of `tokens` (1-D ids).

    Returns {"tokens", "windows", "stride", "nll", "ppl", "bpb", "bytes", "per_position"}; `per_position[i]` is the
    mean NLL at window position L - S + i (all L positions for nonoverlap; the S target tokens for fixed-target,
    where `stride` is the target size). Raises `LengthBeyondScheme` when the model cannot serve `length` (checked
    before any forward when the model exposes `scheme.max_length`) and ValueError when no window fits. `positions`
    random: every window is fed its own sorted draw from [0, M) as `position_ids` (`positions.Positions`), else
    the model's default 0..L-1. With `key_tokens` the model is the evaluator and the result also holds
    "key_targets": the sorted stream indices of the cell's key tokens (`longppl.key_targets`). With `score_keys`
    (such indices) it holds "longppl" and "key_tokens", the model's LongPPL on those targets and their count
    (`longppl.KeyTokenSum.result`).
    """
    S = resolve_stride(protocol, stride, length)
    starts = plan_windows(len(tokens), length, S, n_tokens, protocol)
    if len(starts) == 0:
        raise ValueError(no_window_reason(protocol, len(tokens), length, S, n_tokens))
    if positions is not None and positions.beyond_range(length):
        raise ValueError(positions.beyond_range(length))
    generator = positions.generator(length) if positions is not None and positions.random else None
    scheme = getattr(model, "scheme", None)
    limit = getattr(scheme, "max_length", None)
    if limit is not None and length > limit:
        raise LengthBeyondScheme(getattr(scheme, "name", type(scheme).__name__), limit, length)

    device = torch.device(device)
    use_bf16 = dtype == "bf16"
    per_batch = max(1, batch_tokens // length)
    offsets = np.arange(length + 1, dtype=np.int64)
    pos_sum = torch.zeros(S, dtype=torch.float64)
    n_bytes = 0
    candidates = candidate_positions(length, S, key_tokens.train_length) if key_tokens is not None else None
    keys = KeyTokenSum()
    found: list[np.ndarray] = []
    short_ids = (
        short_generator(positions, key_tokens.train_length)
        if key_tokens is not None and positions is not None and positions.random
        else None
    )
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for i in range(0, len(starts), per_batch):
                idx = starts[i : i + per_batch, None] + offsets  # (B, L+1) stream positions
                window = np.asarray(tokens[idx], dtype=np.int64)  # (B, L+1)
                batch = torch.from_numpy(window).to(device)
                x, y = batch[:, :-1], batch[:, -S:]  # (B, L) inputs, (B, S) scored targets
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
                    if generator is None:
                        logits = model(x)  # (B, L, V)
                    else:  # one sorted draw from [0, M) per window, in window order
                        ids = positions.draw(len(x), length, generator).to(device)  # type: ignore[union-attr]
                        logits = model(x, position_ids=ids)  # (B, L, V)
                scored = logits[:, -S:, :].float()  # (B, S, V): log-softmax in fp32
                loss = F.cross_entropy(scored.reshape(-1, scored.size(-1)), y.reshape(-1), reduction="none")
                pos_sum += loss.view(-1, S).double().sum(0).cpu()
                if candidates is not None:
                    first, last = candidates
                    long_nll = loss.view(-1, S)[:, first - (length - S) :].float().cpu()  # (B, last - first + 1)
                    short_nll = short_context_nll(
                        model,
                        tokens,
                        starts[i : i + per_batch],
                        first,
                        last,
                        key_tokens,  # type: ignore[arg-type]
                        batch_tokens=batch_tokens,
                        dtype=dtype,
                        device=device,
                        positions=positions,
                        generator=short_ids,
                    )
                    targets = target_indices(starts[i : i + per_batch], first, last - first + 1)
                    found.append(key_targets(long_nll, short_nll, targets, key_tokens.alpha, key_tokens.beta))  # type: ignore[union-attr]
                if score_keys is not None:
                    targets = target_indices(starts[i : i + per_batch], length - S, S)  # (B, S) of the scored
                    keys.add_at(loss.view(-1, S).float().cpu(), targets, score_keys)
                if token_bytes is not None:
                    n_bytes += int(np.asarray(token_bytes)[window[:, -S:]].sum())
                if progress is not None:
                    progress(f"L={length}", min(i + per_batch, len(starts)), len(starts))
    finally:
        model.train(was_training)

    out = window_scores(pos_sum, len(starts), S, n_bytes)
    if key_tokens is not None:
        out["key_targets"] = np.sort(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)
    if score_keys is not None:
        out.update(keys.result())
    return out
