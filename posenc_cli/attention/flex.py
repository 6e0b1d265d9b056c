"""FlexAttention road: a scheme's bias as a pointwise `score_mod`, the causal mask and the layer's span as a block mask.

PyTorch's `torch.nn.attention.flex_attention` (compiled by Inductor into one fused kernel) evaluates
score_mod(q·kᵀ/√hd, b, h, i, j) inside the attention loop and skips the key blocks the block mask hides, so neither
the (B, H, T, T) bias nor a query chunk of it is ever built: memory stays linear in T, and a sliding window or
fixed chunks cost only their visible blocks. A scheme opts in with `PositionalScheme.score_mod` (`offers_score_mod`);
the schemes whose bias reads only positions offer it, exactly equal to their `bias` hook (contract tests).

What PyTorch 2.13 does (measured here, see docs/design.md): on CPU the compiled forward works (Inductor's C++ template,
a C++ compiler needed), the backward does not exist ("FlexAttention does not support backward on CPU"), and the
uncompiled call is a reference implementation that materialises the full score matrix. So `choose.flex_applies`
takes this road only on `FLEX_MIN_LEN`'s devices and dtypes, for calls without a gradient where the device has no
backward (`FLEX_GRAD_DEVICES`), and the kernel calls the compiled function (`COMPILE`; tests switch it off for speed
at tiny lengths, where the eager reference is exact).

The block mask is built without the (T, T) grid that PyTorch's `create_block_mask` evaluates `mask_mod` on (8 GiB
at 32,768 tokens): every mask here shows each query one interval of keys, [first, last] (`key_bounds`: causal, a
sliding window, chunks, a document, or their intersection), so a block of 128 queries × 128 keys is empty, partial
or full by counting the visible pairs from the intervals (`interval_blocks`, by groups of query blocks), and
`BlockMask.from_kv_blocks` takes the block tables. Memory: the tables are (T/128)² entries (4 MiB at 65,536 tokens),
the counting step at most `BLOCK_STEP_ELEMENTS`; the tables equal `create_block_mask`'s (tests).

Packed rows (`PositionContext.documents`): the block mask is built per row from the document ids (`key_bounds`
with `Documents`), once per forward, so blocks wholly in other documents are skipped as the causal ones are.

Not here: dropout (FlexAttention has none), the KV cache's query rows (`Rows`) and position remapping (`Remapped`:
its merged score picks one of two dot products per pair, q·k or q₂·k₂, and a score_mod receives only the first).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from posenc_cli.attention.state import AttentionState, Kernel
from posenc_cli.positional.base import Documents
from posenc_cli.positional.span import FULL, Span

BLOCK = 128  # queries and keys per block of the block mask (PyTorch's default sparse block)
BLOCK_STEP_ELEMENTS = 2**18  # the most (row, query, key block) counts one step of `interval_blocks` holds (2 MiB)
COMPILE = True  # the kernel calls torch.compile(flex_attention); False: PyTorch's eager reference (materialises T²)


@dataclass(frozen=True)
class Flex(Kernel):
    """softmax(q·kᵀ/√hd + bias + mask)·v by FlexAttention: the scheme's `score_mod` for the bias, the causal mask and
    `span` as a block mask (`block_mask`)."""

    causal: bool = True
    span: Span = FULL

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, state: AttentionState, layer: int) -> Tensor:
        score_mod = state.scheme.score_mod(layer, state.ctx)
        if score_mod is None:
            raise ValueError(f"scheme '{state.scheme.name}' offers score_mod but its score_mod hook returned None")
        if state.ctx.documents is None:
            mask = block_mask(q.shape[2], self.causal, self.span, str(q.device))
        else:  # packed rows: one block mask per row, built once per forward for the layers of this span
            key = (self.causal, self.span)
            if key not in state.flex_masks:
                state.flex_masks[key] = document_block_mask(state.ctx.documents, self.causal, self.span)
            mask = state.flex_masks[key]
        return flex_function()(q, k, v, score_mod=score_mod, block_mask=mask)  # (B, H, T, hd)


def mask_mod(causal: bool, span: Span) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor] | None:
    """FlexAttention's mask_mod (b, h, q_idx, kv_idx) -> visible, the same keys `kernels.fold_causal_mask` leaves:
    causal (j ≤ i), a sliding window (j > i − W), chunks (⌊i/C⌋ = ⌊j/C⌋); None when nothing is hidden."""
    if not causal and span.is_full:
        return None

    def visible(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        if span.kind == "sliding":
            seen = kv_idx > q_idx - span.size
        elif span.kind == "chunked":
            seen = kv_idx // span.size == q_idx // span.size
        else:
            return q_idx >= kv_idx  # causal, full span
        return seen & (q_idx >= kv_idx) if causal else seen

    return visible


def document_mask_mod(
    documents: Documents, causal: bool, span: Span
) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """`mask_mod` for packed rows: the key in the query's own document (`Documents.segment`), the span at the
    tokens' indexes within it (`Documents.local`), causal in token order; the keys `kernels.fold_causal_mask` leaves
    with `documents`."""
    segment, local = documents.segment, documents.local

    def visible(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        seen = segment[b, q_idx] == segment[b, kv_idx]
        lq, lk = local[b, q_idx], local[b, kv_idx]
        if span.kind == "sliding":
            seen = seen & (lk > lq - span.size)
        elif span.kind == "chunked":
            seen = seen & (lk // span.size == lq // span.size)
        return seen & (q_idx >= kv_idx) if causal else seen

    return visible


def document_block_mask(documents: Documents, causal: bool, span: Span) -> BlockMask:
    """The BlockMask of `document_mask_mod`, one per row (B, shared by the heads)."""
    T = documents.segment.shape[1]
    lo, hi = key_bounds(T, causal, span, documents)  # (B, T) each
    return interval_block_mask(lo, hi, document_mask_mod(documents, causal, span))


@functools.lru_cache(maxsize=16)
def block_mask(length: int, causal: bool, span: Span, device: str) -> BlockMask | None:
    """The BlockMask of `mask_mod` for `length` queries and keys (shared by every batch row and head; spans follow
    token order, so it depends on these four facts only), built once per (length, causal, span, device)."""
    mod = mask_mod(causal, span)
    if mod is None:
        return None
    lo, hi = key_bounds(length, causal, span, device=device)  # (1, T) each
    return interval_block_mask(lo, hi, mod)


def key_bounds(
    length: int, causal: bool, span: Span, documents: Documents | None = None, device: str | torch.device = "cpu"
) -> tuple[Tensor, Tensor]:
    """The keys each query may see under `mask_mod` / `document_mask_mod`: one interval [lo, hi] (inclusive) per
    query, (1, T) each, or (B, T) with `documents` (packed rows: the query's document, chunks from its first token).

    Causal: hi = i; a sliding window: lo = i − W + 1; chunks: lo = the chunk's first key, hi (not causal) its last;
    each clipped to the query's document ([0, T − 1] without documents)."""
    if documents is not None:
        device = documents.local.device
    i = torch.arange(length, device=device)[None]  # (1, T)
    if documents is None:
        local, first, last = i, torch.zeros_like(i), torch.full_like(i, length - 1)
    else:
        local = documents.local  # (B, T) the token's index within its document
        first = i - local  # (B, T) its document's first token
        ends = torch.ones_like(local, dtype=torch.bool)
        ends[:, :-1] = local[:, 1:] == 0  # the next token starts a document
        last = torch.where(ends, i, length).flip(-1).cummin(-1).values.flip(-1)  # (B, T) its document's last token
    if span.kind == "sliding":
        lo, hi = torch.clamp(i - span.size + 1, min=first), last
    elif span.kind == "chunked":
        lo = first + torch.div(local, span.size, rounding_mode="floor") * span.size
        hi = torch.minimum(lo + span.size - 1, last)
    else:
        lo, hi = first, last
    return lo, torch.minimum(hi, i) if causal else hi


def interval_blocks(lo: Tensor, hi: Tensor, block: int = BLOCK) -> tuple[Tensor, Tensor]:
    """Per-query key intervals lo, hi (R, T) inclusive -> partial, full (R, 1, n, n) bool, n = ⌈T/block⌉: whether a
    block of `block` queries × `block` keys holds some visible pairs but not all, or all (a block cut by the end
    of the sequence is never full, as `create_block_mask` pads it with hidden pairs). Visible pairs are counted by
    groups of query blocks, (R, g·block, n) at most `BLOCK_STEP_ELEMENTS` (or one query block): no (T, T) grid."""
    R, T = lo.shape
    n = -(-T // block)
    pad = n * block - T
    lo = F.pad(lo, (0, pad), value=1)  # (R, n·block): padded queries see nothing (lo > hi)
    hi = F.pad(hi, (0, pad), value=0)
    key_lo = torch.arange(n, device=lo.device) * block  # (n,) each key block's first key
    key_hi = torch.clamp(key_lo + block - 1, max=T - 1)  # (n,) and its last
    counts = torch.empty(R, n, n, dtype=torch.int64, device=lo.device)  # (R, query block, key block)
    group = max(1, BLOCK_STEP_ELEMENTS // (R * block * n))  # query blocks per step
    for a in range(0, n, group):
        b = min(a + group, n)
        rows_lo, rows_hi = lo[:, a * block : b * block, None], hi[:, a * block : b * block, None]  # (R, g·block, 1)
        seen = (torch.minimum(rows_hi, key_hi) - torch.maximum(rows_lo, key_lo) + 1).clamp_(min=0)  # (R, g·block, n)
        counts[:, a:b] = seen.view(R, b - a, block, n).sum(2)  # (R, g, n)
    full = counts == block * block
    return ((counts > 0) & ~full)[:, None], full[:, None]


def interval_block_mask(lo: Tensor, hi: Tensor, mod: Callable[..., Tensor], block: int = BLOCK) -> BlockMask:
    """The BlockMask of `mod` from its per-query key intervals lo, hi (R, T) (`key_bounds`), as
    `create_block_mask(mod, R, None, T, T)` builds it (partial and full blocks apart), without the (T, T) grid."""
    partial, full = interval_blocks(lo, hi, block)  # (R, 1, n, n) each
    tables = [t for dense in (partial, full) for t in ordered_blocks(dense)]
    T = lo.shape[1]
    return BlockMask.from_kv_blocks(*tables, BLOCK_SIZE=block, mask_mod=mod, seq_lengths=(T, T))


def ordered_blocks(dense: Tensor) -> tuple[Tensor, Tensor]:
    """bool (R, 1, n, n) blocks -> (R, 1, n) blocks per query block, (R, 1, n, n) their key-block indexes first (in
    ascending order, then the rest): the int32 tables `BlockMask` holds."""
    dense = dense.to(torch.int32)
    indices = torch.argsort(dense, dim=-1, descending=True, stable=True)
    return dense.sum(-1).to(torch.int32), indices.to(torch.int32).contiguous()


@functools.cache
def _compiled() -> Callable[..., Tensor]:
    return torch.compile(flex_attention, dynamic=False)


@functools.cache
def can_compile(device: str) -> bool:
    """Whether Inductor can build the fused kernel on `device` (a device type): a C++ compiler on CPU (its search:
    `$CXX`, else g++ / clang++ on macOS, as `run.compile.cxx_compiler`), the triton package on CUDA."""
    if device == "cuda":
        return importlib.util.find_spec("triton") is not None
    return shutil.which(os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")) is not None


def flex_function() -> Callable[..., Tensor]:
    """torch.compile(flex_attention), compiled on first use (`COMPILE`), else the eager reference."""
    if COMPILE:
        return _compiled()
    return flex_attention
