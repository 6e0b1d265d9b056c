"""The streaming protocol of `posenc eval-extrapolate` (StreamingLLM, Xiao et al. 2023, arXiv 2309.17453).

Windowed attention over a long stream, with attention sinks. Each stream is one non-overlapping window of the
validation split (inputs u_0..u_{L-1}, targets u_1..u_L, as the nonoverlap protocol cuts them), read with a cache
that keeps the first N tokens of the stream (the sinks) and the most recent tokens. Positions are assigned inside
the cache, as the paper does: the sinks at 0..N-1, the kept recent tokens at N, N+1, ... in stream order, never
their stream positions. N = 0 is plain sliding-window attention.

Exact semantics, with window W, sinks N and block size S (the `stride` of the entry; `DEFAULT_BLOCK` = 16 unless
given):

- warm-up: tokens t < N + W (the cache is not full yet) see the whole prefix u_0..u_t at positions 0..t, exactly
  as the nonoverlap protocol does; they are scored by one causal forward over u_0..u_{min(L, N+W)-1}.
- after it, the remaining tokens t = N+W, ..., L-1 are cut into blocks of S consecutive tokens (the last block may
  be shorter). A block starting at t0 is one forward over the sinks u_0..u_{N-1} followed by u_{t0-W+1}..u_{t0+S'-1}
  (S' the block's size), at positions 0..N+W+S'-2, causal by token order, and scores its last S' tokens. So token
  t0 + b attends to the N sinks and to its W + b most recent tokens (itself included), its own position being
  N + W - 1 + b.

S = 1 is StreamingLLM's decoding exactly: every scored token past the warm-up sees the sinks and its W most recent
tokens (itself included), at positions 0..N+W-1. S > 1 shares one cache among S tokens (cost per scored token
(N+W+S-1)/S token-forwards instead of N+W) and lets token b of a block see b more recent tokens; the positions
then reach N+W+S-2. With N = 0 and W >= L nothing is ever evicted and the protocol is the nonoverlap protocol at
length L; with N = 0 and S = 1 the tokens past the warm-up are those of the sliding protocol with windows of W and
stride 1. Every scheme works: each forward holds only the cache, in order, so its positions are the row's own
indices and the model's default position ids; causality follows token order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from posenc_cli.errors import LengthBeyondScheme
from posenc_cli.evaluation.results import window_scores

__all__ = ["DEFAULT_BLOCK", "block_rows", "default_window", "evaluate_streaming", "streaming_reference"]

# Tokens sharing one cache unless --stride says otherwise: S = 1 (StreamingLLM's decoding exactly) costs N + W
# token-forwards per scored token, 60x the nonoverlap protocol's time on model=tiny (38 tokens/s against 2,300 at
# 2048 tokens, 1 thread of a loaded EPYC); S = 16 costs (N + W + 15)/16, 544 tokens/s there.
DEFAULT_BLOCK = 16

Progress = Callable[[str, int, int], None]


def block_rows(length: int, window: int, sinks: int, block: int) -> list[tuple[int, int]]:
    """(t0, size) of each block after the warm-up of a stream of `length` scored tokens; empty when the whole
    stream fits the cache (length <= sinks + window)."""
    first = sinks + window
    return [(t0, min(block, length - t0)) for t0 in range(first, length, block)]


def default_window(base_length: int, sinks: int, block: int) -> int:
    """W when not given: the cache's positions (0..N+W+S-2) end at base_length - 1, the last position the model
    was trained at (at least 1)."""
    return max(1, base_length - sinks - block + 1)


def _row_index(t0: int, size: int, window: int, sinks: int) -> np.ndarray:
    """Offsets into the stream (inputs u_j = stream[j]) of one block's forward: sinks, then the window and block."""
    return np.concatenate([np.arange(sinks), np.arange(t0 - window + 1, t0 + size)]).astype(np.int64)


def evaluate_streaming(
    model: nn.Module,
    tokens: np.ndarray,
    token_bytes: np.ndarray | None,
    *,
    length: int,
    window: int,
    sinks: int,
    block: int = 1,
    n_tokens: int = 16384,
    batch_tokens: int = 16384,
    dtype: str = "fp32",
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Score `model` with the streaming protocol on streams of `length` tokens cut from `tokens` (1-D ids).

    Streams start at 0, L, 2L, ... (the nonoverlap protocol's windows): ⌈n_tokens / L⌉ of them, or as many as fit.
    Returns `perplexity.evaluate_model`'s keys ("tokens", "windows" = streams, "stride" = block size, "nll", "ppl",
    "bpb", "bytes", "per_position": mean NLL at each stream position 0..L-1). Raises `LengthBeyondScheme` when the
    cache (N + W + S - 1 positions, or L if smaller) exceeds the scheme's limit, ValueError when no stream fits.
    """
    if window < 1 or sinks < 0 or block < 1:
        raise ValueError(f"streaming needs window >= 1, sinks >= 0 and block >= 1 (got {window}, {sinks}, {block})")
    n_streams = min(max(1, math.ceil(n_tokens / length)), (len(tokens) - 1) // length)
    if n_streams < 1:
        raise ValueError(f"validation split has {len(tokens)} tokens; one stream needs {length + 1}")
    warm = min(length, sinks + window)
    blocks = block_rows(length, window, sinks, block)
    widest = max([warm] + [sinks + window + size - 1 for _, size in blocks])
    scheme = getattr(model, "scheme", None)
    limit = getattr(scheme, "max_length", None)
    if limit is not None and widest > limit:
        raise LengthBeyondScheme(getattr(scheme, "name", type(scheme).__name__), limit, widest)

    device = torch.device(device)
    starts = np.arange(n_streams, dtype=np.int64) * length  # (n_streams,)
    stream_idx = starts[:, None] + np.arange(length + 1, dtype=np.int64)  # (n_streams, L+1)
    streams = np.asarray(tokens[stream_idx], dtype=np.int64)  # (n_streams, L+1): inputs [:, :-1], targets [:, 1:]
    pos_sum = torch.zeros(length, dtype=torch.float64)

    # jobs: (row offsets into a stream, first scored stream position, scored count); rows of one shape batch together
    jobs: list[tuple[np.ndarray, int, int]] = [(np.arange(warm, dtype=np.int64), 0, warm)]
    jobs += [(_row_index(t0, size, window, sinks), t0, size) for t0, size in blocks]
    total_rows = len(jobs) * n_streams
    done = 0
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for offsets, t0, size in _grouped(jobs):
                # rows of one shape, batched (stream, block) up to batch_tokens. A row's cache positions are its
                # own indices 0..T-1 (sinks first, then the kept tokens in order): the model's default ids
                row_len = len(offsets[0])
                per_batch = max(1, batch_tokens // row_len)
                pairs = [(s, j) for s in range(n_streams) for j in range(len(offsets))]
                for i in range(0, len(pairs), per_batch):
                    chunk = pairs[i : i + per_batch]
                    x = np.stack([streams[s, offsets[j]] for s, j in chunk])  # (B, T) inputs
                    y = np.stack([streams[s, t0[j] + 1 : t0[j] + size + 1] for s, j in chunk])  # (B, size) targets
                    inputs = torch.from_numpy(x).to(device)
                    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
                        logits = model(inputs)  # (B, T, V)
                    scored = logits[:, -size:, :].float()  # (B, size, V)
                    target = torch.from_numpy(y).to(device)
                    loss = F.cross_entropy(scored.reshape(-1, scored.size(-1)), target.reshape(-1), reduction="none")
                    loss = loss.view(len(chunk), size).double().cpu()
                    for r, (_, j) in enumerate(chunk):
                        pos_sum[t0[j] : t0[j] + size] += loss[r]
                    done += len(chunk)
                    if progress is not None:
                        progress(f"L={length}", done, total_rows)
    finally:
        model.train(was_training)

    n_bytes = int(np.asarray(token_bytes)[streams[:, 1:]].sum()) if token_bytes is not None else 0
    return window_scores(pos_sum, n_streams, block, n_bytes)


def _grouped(jobs: list[tuple[np.ndarray, int, int]]) -> list[tuple[list[np.ndarray], list[int], int]]:
    """Jobs of equal row length and scored count grouped: (row offsets, block starts, scored count) per group."""
    groups: dict[tuple[int, int], tuple[list[np.ndarray], list[int], int]] = {}
    for offsets, t0, size in jobs:
        group = groups.setdefault((len(offsets), size), ([], [], size))
        group[0].append(offsets)
        group[1].append(t0)
    return list(groups.values())


def streaming_reference(
    model: nn.Module, stream: np.ndarray, *, window: int, sinks: int, block: int = 1
) -> torch.Tensor:
    """Direct, unoptimised reading of one stream (inputs stream[:-1], targets stream[1:]) by the semantics above:
    for each token t, one forward over exactly what it sees (the whole prefix while t < N + W, else the N sinks and
    stream[t0-W+1..t] for its block's start t0) at positions 0..len-1, keeping the last logit. Returns the NLL of
    each target, (len(stream) - 1,) float64. For tests."""
    first = sinks + window
    losses = []
    with torch.inference_mode():
        for t in range(len(stream) - 1):
            t0 = first + (t - first) // block * block
            keep = list(range(t + 1)) if t < first else [*range(sinks), *range(t0 - window + 1, t + 1)]
            x = torch.as_tensor(np.asarray(stream)[keep], dtype=torch.long)[None]  # (1, T)
            ids = torch.arange(len(keep), dtype=torch.long)
            logits = model(x, position_ids=ids)[0, -1].float()  # (V,)
            losses.append(F.cross_entropy(logits[None], torch.as_tensor([int(stream[t + 1])])).double())
    return torch.stack(losses)
