"""Which attention kernel a layer runs: `choose_kernel(spec)`, a pure function of one `KernelSpec`.

`describe` gathers the spec from the scheme's hooks, the context and q (dtype, device, whether it needs a gradient,
its shape) plus the layer's settings; `forward_kernel` calls `choose_kernel` once per distinct spec and
forward. The device and memory policy the choice follows is written here, as data:

- `BIAS_CHUNK_BYTES`: budget for one chunk's fp32 bias, (B, H, chunk, T) · 4 bytes. SDPA's math kernel allocates a
  few tensors of the same size (scores, softmax), so the transient peak is a small multiple of this.
- `KEY_BIAS_DEVICES`: where an offered `key_bias` replaces the chunked bias road (fp32/fp64 only; see
  `kernels.KeyBias`).
- `FP32_GRAD_DEVICES`, `FP32_GRAD_MAX_LEN`: where SDPA's backward is slower in bf16 than in fp32, training under
  bf16 autocast attends in fp32 (forward-only calls stay in bf16). PyTorch's fused CPU kernel, AMD EPYC with
  AVX512-BF16, H=4, hd=32, one thread, forward and backward: bf16 took 2.7x the fp32 time at T=64, 1.9x at 128, 1.3x
  at 256, 1.0x at 512 and 0.7x at 1024 (so up to FP32_GRAD_MAX_LEN only); a model=tiny training step at T=128 drops
  to 0.64-0.74x (benchmarks/ab_step.py).

- `FLEX_MIN_LEN`, `FLEX_GRAD_DEVICES`: where (device type and dtype) a scheme's `score_mod` replaces its bias road
  (`flex.Flex`, FlexAttention), from which length, and where it may carry a gradient. Only devices and lengths where
  it was measured faster than today's road are listed (benchmarks/flex_vs_chunked.py; docs/design.md has the
  numbers).

Trained sinks (`spec.sinks`, `model.attn_sinks`): one logit per head joins each softmax row's normaliser
(`options.attn_sinks.sink_softmax`). Only the roads that form the weights themselves can add it: `Scored` and
`Remapped`. Every SDPA road returns no log-sum-exp to correct its output by σ(ℓ − b) afterwards, and FlexAttention's
`score_mod` cannot add a column (its log-sum-exp is not returned on CPU), so a layer with sinks takes `Scored`
(`Remapped` for a remapping scheme) whatever else its spec says: fp32 logits by query chunks, as for a scheme that
owns its scores.

A new road is a new kernel class and one more rule here; a spec field is added only for a fact the rule reads
(the layer's attention span; whether the scheme owns the logits or the normaliser, `scored.Scored`; whether the
rows are packed with documents).

Packed rows (`documents`): every road of a full forward takes the document mask (`kernels`' module doc) except
two, which the rules send elsewhere: `Fused`'s `is_causal` cannot express it, so a forward without a bias takes
`Masked` (SDPA with a boolean mask by chunks of `DOCUMENT_CHUNK` queries, each from its documents' first key on, as
`KeyBias` then does too); `BlockCausal` batches blocks at multiples of C, while a document's chunks start at its
first token, so a chunked span takes `Windowed`. The KV cache's rows see documents when a batch of prompts is
left-padded (`kv_cache`): `Rows`, `Scored` and `Remapped` mask by them, and `LastRow`, which masks nothing, is not
taken.

Memory of sliding, chunked and document masks: no road the rules take for them builds a T×T mask, bias or score
tensor, so an evaluation's memory grows linearly in T (benchmarks/window_memory.py; tests/attention/
test_span_memory.py holds every road under a shrunk budget). `Windowed` sizes its chunks from the span,
n·(n + W) scores each; `Scored` too for a windowed layer of a full forward; `BlockCausal` and `Fused` build no
mask; `Masked`, `KeyBias` and `ChunkedBias` in packed rows score (chunk, keys from the documents' first token);
`Flex` builds its block mask from per-query key intervals (`flex.interval_block_mask`: (T/128)² block tables, no
T×T grid). The one quadratic tensor a bias road may build, `SharedMask`'s (B, H, T, T), is taken only when it fits
one chunk of `BIAS_CHUNK_BYTES` and never for a windowed layer (the span rule comes first).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from posenc_cli.attention.flex import Flex, can_compile
from posenc_cli.attention.kernels import (
    ChunkedBias,
    Fused,
    InFp32,
    KeyBias,
    LastRow,
    Masked,
    Remapped,
    Rows,
    SharedMask,
)
from posenc_cli.attention.scored import Scored
from posenc_cli.attention.spec import KernelSpec
from posenc_cli.attention.state import AttentionState, Kernel
from posenc_cli.attention.windowed import BlockCausal, Windowed
from posenc_cli.positional.base import PositionalScheme, PositionContext
from posenc_cli.positional.span import FULL, Span

BIAS_CHUNK_BYTES = 64 * 2**20
KEY_BIAS_DEVICES: tuple[str, ...] = ("cpu",)
FP32_GRAD_DEVICES: tuple[str, ...] = ("cpu",)
FP32_GRAD_MAX_LEN = 256
# (device type, dtype) where the FlexAttention road is taken -> the shortest length it is taken at. CPU fp32 from 32768
# tokens: torch 2.13, Intel Xeon (2 shared cores), one thread, batch 1, 4 heads × 32: 0.14-0.55x the chunked road's
# time per call at 32768 (27.9 s vs 197.5 s, 16.3 vs 29.5, 16.8 vs 36.0: docs/design.md names them), 16 MiB instead of
# 0.3-4 GiB, so the compile (100-330 s here, once per scheme and length) is repaid within a few forwards; at 8192 it
# was 0.07-0.55x per call, but seconds saved per forward against minutes of compile. The key-bias road stays where
# it applies (faster). No GPU measured yet (benchmarks/flex_vs_chunked.py --device cuda).
FLEX_MIN_LEN: dict[tuple[str, torch.dtype], int] = {("cpu", torch.float32): 32768}
FLEX_GRAD_DEVICES: tuple[str, ...] = ("cuda",)  # PyTorch 2.13 has no FlexAttention backward on CPU
# Packed rows on the SDPA roads (`Masked`, `KeyBias`): queries per chunk of `kernels.attend_documents`, each chunk
# scoring keys from its documents' first token on. torch 2.13 CPU, one thread, B = 4, 4 heads × 32, forward and
# backward: one (B, 1, T, T) boolean mask took 634 ms at T = 2048 (documents of 200 tokens; 337 ms causal without
# documents), chunks of 64/128/256/512 queries 96/92/107/166 ms; documents of 1000: 562 vs 209/188/191/217 ms; T = 512,
# documents of 60: 32 vs 11/14/19/34 ms. A row of at most this many tokens takes one call.
DOCUMENT_CHUNK = 128


def choose_kernel(spec: KernelSpec) -> Kernel:
    """The attention kernel for `spec` (the rules in order; the first that applies wins)."""
    if attends_in_fp32(spec):
        return InFp32(choose_kernel(replace(spec, dtype=torch.float32)))
    if spec.owns_scores or (spec.sinks and not spec.remap):  # own logits, normaliser or sinks: no fused kernel
        chunk = queries_per_chunk(spec, BIAS_CHUNK_BYTES // 2)  # logits and weights, two fp32 tensors per chunk
        if not spec.span.is_full and spec.causal and spec.chunk_size is None and not spec.q_start:  # n + W keys
            chunk = spec.span.queries_per_chunk(BIAS_CHUNK_BYTES // (8 * spec.batch * spec.n_head))
        return Scored(
            chunk, causal=spec.causal, dropout_p=spec.dropout_p, q_start=spec.q_start, span=spec.span, sinks=spec.sinks
        )
    if spec.remap:
        chunk = queries_per_chunk(spec, BIAS_CHUNK_BYTES // 2)  # two fp32 score tensors per chunk
        return Remapped(
            chunk, causal=spec.causal, dropout_p=spec.dropout_p, q_start=spec.q_start, span=spec.span, sinks=spec.sinks
        )
    if spec.q_start:
        # one row sees every key (no pads: the rows of left-padded prompts take `Rows`, which masks them)
        if spec.seq_len - spec.q_start == 1 and not spec.has_bias and spec.span.is_full and not spec.documents:
            return LastRow(spec.q_start, dropout_p=spec.dropout_p)
        return Rows(spec.q_start, dropout_p=spec.dropout_p, span=spec.span)
    if flex_applies(spec):
        return Flex(causal=spec.causal, span=spec.span)
    if not spec.span.is_full:  # a window or chunks hide keys at this length
        chunks = spec.span.kind == "chunked" and not spec.documents  # a document's chunks start at its first token
        if chunks and spec.causal and not spec.has_bias and spec.chunk_size is None:
            return BlockCausal(spec.span.size, dropout_p=spec.dropout_p)
        chunk = spec.chunk_size or spec.span.queries_per_chunk(BIAS_CHUNK_BYTES // (4 * spec.batch * spec.n_head))
        if not spec.causal and spec.chunk_size is None:  # a chunk sees every later key: sized against T
            chunk = queries_per_chunk(spec)
        return Windowed(spec.span, chunk, causal=spec.causal, dropout_p=spec.dropout_p)
    if not spec.has_bias:
        if spec.documents:  # is_causal cannot hide other documents: a boolean mask, by chunks of queries
            return Masked(DOCUMENT_CHUNK, causal=spec.causal, dropout_p=spec.dropout_p)
        return Fused(causal=spec.causal, dropout_p=spec.dropout_p)
    if key_bias_applies(spec):
        return KeyBias(dropout_p=spec.dropout_p, chunk=DOCUMENT_CHUNK if spec.documents else None)
    chunk = queries_per_chunk(spec)
    if chunk >= spec.seq_len and spec.bias_shared:  # one chunk: build bias + mask once per forward
        return SharedMask(causal=spec.causal, dropout_p=spec.dropout_p)
    return ChunkedBias(chunk, causal=spec.causal, dropout_p=spec.dropout_p)


def attends_in_fp32(spec: KernelSpec) -> bool:
    """bf16 that needs gradients on `FP32_GRAD_DEVICES`, at most `FP32_GRAD_MAX_LEN` long (see the module doc)."""
    return (
        spec.needs_grad
        and spec.dtype == torch.bfloat16
        and spec.device in FP32_GRAD_DEVICES
        and spec.seq_len <= FP32_GRAD_MAX_LEN
    )


def key_bias_applies(spec: KernelSpec) -> bool:
    """Whether the key-bias road is taken: a causal full forward whose bias the scheme offers as `key_bias`, no
    forced chunking, and a dtype and device where it is precise and fast (fp32/fp64 on `KEY_BIAS_DEVICES`)."""
    return (
        spec.offers_key_bias
        and spec.causal
        and spec.chunk_size is None
        and spec.device in KEY_BIAS_DEVICES
        and spec.dtype in (torch.float32, torch.float64)
    )


def flex_applies(spec: KernelSpec) -> bool:
    """Whether the FlexAttention road is taken: a bias the scheme offers as `score_mod`, the full forward (no KV-cache
    rows, no remapping, no forced chunking, no dropout), where Inductor can compile it, on a (device, dtype) of
    `FLEX_MIN_LEN` from its length on, and without a gradient unless the device has FlexAttention's backward
    (`FLEX_GRAD_DEVICES`).
    Where the key-bias road applies (full span) it stays: it was faster than FlexAttention on CPU at every length
    measured."""
    return (
        spec.has_bias
        and not (spec.span.is_full and key_bias_applies(spec))
        and spec.offers_score_mod
        and not spec.remap
        and spec.q_start == 0
        and spec.chunk_size is None
        and spec.dropout_p == 0.0
        and spec.flex_compiles
        and (spec.device, spec.dtype) in FLEX_MIN_LEN
        and spec.seq_len >= FLEX_MIN_LEN[spec.device, spec.dtype]
        and (not spec.needs_grad or spec.device in FLEX_GRAD_DEVICES)
    )


def queries_per_chunk(spec: KernelSpec, budget: int | None = None) -> int:
    """The forced `chunk_size`, else as many queries as fit in `budget` (`bias_chunk_size`)."""
    if spec.chunk_size is not None:
        return spec.chunk_size
    return bias_chunk_size(spec.batch, spec.n_head, spec.seq_len, budget)


def bias_chunk_size(batch: int, n_head: int, k_len: int, budget: int | None = None) -> int:
    """Queries per chunk so that a (batch, n_head, chunk, k_len) fp32 tensor fits in `budget` (BIAS_CHUNK_BYTES)."""
    budget = BIAS_CHUNK_BYTES if budget is None else budget
    return max(1, budget // (4 * batch * n_head * k_len))


def remap_applies(window: int, ctx: PositionContext, min_id: int | None = None) -> bool:
    """Whether some pair of ids is at least `window` apart (else every pair takes the normal score: plain road).
    `min_id`: the smallest id when already known (`AttentionState.min_id`), else read from the ids."""
    if ctx.max_position is None:
        return ctx.seq_len > window  # ids 0..T−1: the largest distance is T − 1
    lo = int(ctx.positions.min()) if min_id is None else min_id
    return ctx.max_position - lo >= window


def describe(
    state: AttentionState,
    q: Tensor,
    *,
    causal: bool = True,
    q_start: int = 0,
    chunk_size: int | None = None,
    dropout_p: float = 0.0,
    span: Span = FULL,
    sinks: bool = False,
) -> KernelSpec:
    """The `KernelSpec` of attending with q (B, H, T − q_start, hd), the query rows [q_start, T), under `state`'s
    scheme and context, in a layer of attention span `span` (`sinks`: with trained sink logits)."""
    scheme, ctx = state.scheme, state.ctx
    window = scheme.remap_window
    min_id = state.min_id() if window and ctx.max_position is not None else None  # one host sync per forward
    remap = bool(window) and remap_applies(window, ctx, min_id)
    B, H, Tq, _ = q.shape
    T = q_start + Tq
    return KernelSpec(
        has_bias=scheme.has_bias,
        dtype=q.dtype,
        device=q.device.type,
        seq_len=T,
        batch=B,
        n_head=H,
        needs_grad=q.requires_grad,
        bias_shared=scheme.bias_shared_across_layers,
        offers_key_bias=scheme.offers_key_bias,
        offers_score_mod=scheme.offers_score_mod,
        owns_scores=scheme.owns_scores,
        flex_compiles=scheme.offers_score_mod and flex_length(q, T) and can_compile(q.device.type),
        remap=remap,
        causal=causal,
        q_start=q_start,
        chunk_size=chunk_size,
        dropout_p=dropout_p,
        span=FULL if span.covers(T) else span,
        documents=ctx.documents is not None,
        sinks=sinks,
    )


def flex_length(q: Tensor, length: int) -> bool:
    """Whether `FLEX_MIN_LEN` lists q's device and dtype at `length` tokens: only then is the compiler looked for, so
    a traced forward (`train.compile`) at other lengths never calls the (cached, untraceable) search."""
    threshold = FLEX_MIN_LEN.get((q.device.type, q.dtype))
    return threshold is not None and length >= threshold


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scheme: PositionalScheme,
    layer: int,
    ctx: PositionContext,
    *,
    causal: bool = True,
    dropout_p: float = 0.0,
    chunk_size: int | None = None,
    q_start: int = 0,
    state: AttentionState | None = None,
    span: Span = FULL,
    sinks: Tensor | None = None,
) -> Tensor:
    """softmax(q·kᵀ/√hd + bias + mask)·v for q (B, H, T − q_start, hd), the query rows [q_start, T), and k, v
    (B, H, T, hd) -> (B, H, T − q_start, hd), through the kernel that `choose_kernel` picks for this call
    (`state`: the forward's, whose kernels and tables it reuses; None: a fresh one for `scheme` and `ctx`).

    `chunk_size` forces the number of queries per chunk on the bias road. `q_start` > 0 (decoding with a KV cache,
    causal): q holds only the query rows [q_start, T), attended against every key. `span`: the layer's attention
    span (`positional.span`; full by default). `sinks`: the layer's trained sink logits (H,) (`model.attn_sinks`),
    which join every softmax row's normaliser.
    """
    state = AttentionState(scheme, ctx) if state is None else state
    if sinks is not None:
        state.sinks[layer] = sinks
    spec = describe(
        state,
        q,
        causal=causal,
        q_start=q_start,
        chunk_size=chunk_size,
        dropout_p=dropout_p,
        span=span,
        sinks=sinks is not None,
    )
    return forward_kernel(state, spec)(q, k, v, state, layer)


def forward_kernel(state: AttentionState, spec: KernelSpec) -> Kernel:
    """The kernel for `spec` in `state`'s forward: chosen on the first request (`choose_kernel`) and kept in
    `state.kernels`, so every later layer with the same spec reuses it."""
    if spec not in state.kernels:
        state.kernels[spec] = choose_kernel(spec)
    return state.kernels[spec]
