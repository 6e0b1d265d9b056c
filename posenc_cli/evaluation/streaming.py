"""The streaming protocol of `posenc eval-extrapolate` (StreamingLLM, Xiao et al. 2023, arXiv 2309.17453).

Windowed attention over a long stream, with attention sinks, decoded with a KV cache exactly as the reference does
(mit-han-lab/streaming-llm 2e50426: `examples/eval_long_ppl.py` feeds the stream through the model with
`past_key_values` kept; `streaming_llm/kv_cache.py` `StartRecentKVCache` trims the cache to `[0:start] +
[len-recent:]` after every forward; `pos_shift/modify_llama.py:89-102` stores keys unrotated and rotates them at
their in-cache positions 0..kv_len-1, the query at the cache's end). Each stream is one non-overlapping window of
the validation split (inputs u_0..u_{L-1}, targets u_1..u_L, as the nonoverlap protocol cuts them). A token's K/V
are computed once, when it is read, and kept while it stays in the cache: from layer 2 on they carry information
from tokens evicted since, which a fresh forward over the kept tokens would not (`posenc_cli.kv_cache`).

Exact semantics, with window W, sinks N and block size S (the `stride` of the entry; `DEFAULT_BLOCK` = 1 unless
given). posenc's W is the reference's `recent_size` + 1 (the token being read counts), N its `start_size`:

- warm-up: tokens t < N + W see the whole prefix u_0..u_t at positions 0..t, as in the nonoverlap protocol; they
  are read by one causal forward over u_0..u_{min(L, N+W)-1} (the reference feeds them one at a time: the same
  computation), after which the cache keeps the N sinks and the W - 1 most recent tokens.
- after it, the remaining tokens t = N+W, ..., L-1 are read S at a time (the last block may be shorter): one
  forward over the S' new tokens against the cache, then the cache is trimmed again to the sinks and the W - 1
  most recent tokens, their positions re-assigned 0..N+W-2 in cache order. Token t0 + b of a block attends to the
  N sinks and to its W + b most recent tokens (itself included), at position N + W - 1 + b.

S = 1 (the default) is StreamingLLM's decoding: every token past the warm-up sees the sinks and its W most recent
tokens (itself included), at positions 0..N+W-1. S > 1 reads S tokens per forward (positions reach N+W+S-2). With
N = 0 and W >= L nothing is ever evicted and the protocol is the nonoverlap protocol at length L. The cache needs
posenc's model (`GPT.new_cache`). Every scheme works: rotation and bias schemes see the kept keys at their re-assigned
in-cache positions, as the reference does for RoPE (Llama) and ALiBi (MPT); absolute schemes (sinusoidal, learned)
add a position to a token's embedding when it is read, so its cached K/V keep the in-cache position it was read at.

Per-layer layouts (`positional.layout`). The cache is every layer's, and each layer's span and query temperature
are read at the in-cache token indexes, as its positions are. Past the warm-up that honours a span exactly only when
the span sees nothing the cache dropped and nothing the text would hide: a layer whose span hides nothing in a
stream of L tokens (full, or a window or chunk of at least L), and a sliding window W' <= W, whose W' most recent
keys are kept in cache order (so its masks by cache index and by token distance agree, and the sinks stay outside
it). A wider window would see some sinks at shortened distances, and chunks would follow the cache's indexes, not
the text's; such a stream is n/a (`SpanBeyondCache`), with the reason, at every length that evicts anything, and
measured where it does not (L <= N + W: one causal forward). The floor-log temperature takes the in-cache index
(the query's place among the N + W + b keys it attends), as StreamingLLM re-assigns every position.

LongPPL (`key_tokens`, `posenc_cli.evaluation.longppl`): a stream's targets past the training length L are scored
again by plain forwards over L-token windows of the same stream, and the key tokens are those the streaming decode
predicts much better (LSD > α) and well (LCL > β); the decode itself is the same with or without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from posenc_cli.errors import ConfigError, LengthBeyondScheme
from posenc_cli.evaluation.longppl import KeyTokens, KeyTokenSum, candidate_positions, short_context_nll
from posenc_cli.evaluation.results import window_scores

__all__ = [
    "DEFAULT_BLOCK",
    "STREAMING_DECODE",
    "SpanBeyondCache",
    "block_rows",
    "default_window",
    "evaluate_streaming",
    "unserved_span",
]

# How a streaming cell was read, in its key: the KV cache (StreamingLLM's decoding). Cells stored without it were
# measured by re-encoding the kept tokens in a fresh forward per block, which is not StreamingLLM's protocol.
STREAMING_DECODE = "kv-cache"

# Tokens read per forward unless --stride says otherwise: 1, StreamingLLM's decoding. With the KV cache each forward
# reads only the new tokens, so S = 1 costs one (B, 1)-token forward per position for B streams at once.
DEFAULT_BLOCK = 1

Progress = Callable[[str, int, int], None]


def block_rows(length: int, window: int, sinks: int, block: int) -> list[tuple[int, int]]:
    """(t0, size) of each block after the warm-up of a stream of `length` scored tokens; empty when the whole
    stream fits the cache (length <= sinks + window)."""
    first = sinks + window
    return [(t0, min(block, length - t0)) for t0 in range(first, length, block)]


class SpanBeyondCache(LengthBeyondScheme):
    """A layer's span that the streaming cache cannot honour at this stream length: a cell that is n/a, with the
    reason (`unserved_span`), as a length a scheme cannot read is."""

    def __init__(self, scheme: str, why: str, requested: int) -> None:
        self.why = why
        super().__init__(scheme, 0, requested)

    @property
    def reason(self) -> str:
        return self.why


def unserved_span(model: nn.Module, length: int, window: int, sinks: int) -> str | None:
    """Why the streaming cache (sinks N, window W) cannot honour some layer's span on streams of `length` tokens,
    or None when every layer's can (see the module doc): the first such layer, its span, and what would go wrong."""
    if length <= sinks + window or not hasattr(model, "layer_attention"):  # one causal forward; no posenc layers
        return None
    device = next(model.parameters()).device
    views = [a.view for a in model.layer_attention(model.context(torch.zeros(1, 1, dtype=torch.long, device=device)))]
    for i, view in enumerate(views):
        span = view.span
        if span.covers(length) or (span.kind == "sliding" and span.size <= window):
            continue
        if span.kind == "sliding":
            why = f"wider than the streaming window {window}, it would see sinks at shortened distances"
        else:
            why = "its chunks would follow the cache's re-assigned indexes, not the text's"
        return f"layer {i}'s {span.describe()} span: {why}"
    return None


def default_window(base_length: int, sinks: int, block: int) -> int:
    """W when not given: the cache's positions (0..N+W+S-2) end at base_length - 1, the last position the model
    was trained at (at least 1)."""
    return max(1, base_length - sinks - block + 1)


def evaluate_streaming(
    model: nn.Module,
    tokens: np.ndarray,
    token_bytes: np.ndarray | None,
    *,
    length: int,
    window: int,
    sinks: int,
    block: int = DEFAULT_BLOCK,
    n_tokens: int = 16384,
    batch_tokens: int = 16384,
    dtype: str = "fp32",
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    key_tokens: KeyTokens | None = None,
) -> dict[str, Any]:
    """Score `model` with the streaming protocol on streams of `length` tokens cut from `tokens` (1-D ids).

    Streams start at 0, L, 2L, ... (the nonoverlap protocol's windows): ⌈n_tokens / L⌉ of them, or as many as fit,
    read `batch_tokens` // (N + W + S) streams at a time through one KV cache each. Returns
    `perplexity.evaluate_model`'s keys ("tokens", "windows" = streams, "stride" = block size, "nll", "ppl", "bpb",
    "bytes", "per_position": mean NLL at each stream position 0..L-1). Raises `LengthBeyondScheme` when the cache
    (N + W + S - 1 positions, or L if smaller) exceeds the scheme's limit, `SpanBeyondCache` (one of them) when a
    layer's span cannot be honoured (`unserved_span`), ValueError when no stream fits, and
    ConfigError for a model without posenc's KV cache. With `key_tokens` the result also holds "longppl" and
    "key_tokens": a stream's targets past the training length scored again with a training-length context (plain
    forwards, no cache: `longppl.short_context_nll`), against their streaming NLL.
    """
    if window < 1 or sinks < 0 or block < 1:
        raise ValueError(f"streaming needs window >= 1, sinks >= 0 and block >= 1 (got {window}, {sinks}, {block})")
    if not hasattr(model, "new_cache"):
        raise ConfigError("the streaming protocol decodes with posenc's KV cache, which this model does not have")
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
    why = unserved_span(model, length, window, sinks)
    if why is not None:
        raise SpanBeyondCache(getattr(scheme, "name", type(scheme).__name__), why, length)

    device = torch.device(device)
    starts = np.arange(n_streams, dtype=np.int64) * length  # (n_streams,)
    stream_idx = starts[:, None] + np.arange(length + 1, dtype=np.int64)  # (n_streams, L+1)
    streams = torch.from_numpy(np.asarray(tokens[stream_idx], dtype=np.int64))  # (n_streams, L+1)
    pos_sum = torch.zeros(length, dtype=torch.float64)
    per_batch = max(1, batch_tokens // widest)
    pieces = [(0, warm), *blocks]  # (first stream position, count) of each forward
    total, done = n_streams * length, 0
    candidates = candidate_positions(length, length, key_tokens.train_length) if key_tokens is not None else None
    keys = KeyTokenSum()
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for first_row in range(0, n_streams, per_batch):
                rows = streams[first_row : first_row + per_batch].to(device)  # (B, L+1)
                cache = model.new_cache(length)  # the cell: the stream (a cell-level temperature reads it)
                stream_nll = torch.zeros(len(rows), length, dtype=torch.float32)  # (B, L) NLL at each position
                for t0, size in pieces:
                    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
                        logits = model(rows[:, t0 : t0 + size], cache=cache)  # (B, size, V)
                    cache.keep_sinks_and_recent(sinks, window - 1)  # StartRecentKVCache after each forward
                    target = rows[:, t0 + 1 : t0 + size + 1]  # (B, size)
                    loss = F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), reduction="none")
                    pos_sum[t0 : t0 + size] += loss.view(len(rows), size).double().sum(0).cpu()
                    stream_nll[:, t0 : t0 + size] = loss.view(len(rows), size).float().cpu()
                    done += len(rows) * size
                    if progress is not None:
                        progress(f"L={length}", done, total)
                if candidates is not None:
                    first, last = candidates
                    short_nll = short_context_nll(
                        model,
                        tokens,
                        starts[first_row : first_row + per_batch],
                        first,
                        last,
                        key_tokens,  # type: ignore[arg-type]
                        batch_tokens=batch_tokens,
                        dtype=dtype,
                        device=device,
                    )
                    keys.add(stream_nll[:, first : last + 1], short_nll, key_tokens)  # type: ignore[arg-type]
    finally:
        model.train(was_training)

    n_bytes = int(np.asarray(token_bytes)[streams[:, 1:].numpy()].sum()) if token_bytes is not None else 0
    out = window_scores(pos_sum, n_streams, block, n_bytes)
    if key_tokens is not None:
        out.update(keys.result())
    return out
