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

Packed rows (`PositionContext.documents`): the block mask is built per row from the document ids
(`document_mask_mod`), once per forward, so blocks wholly in other documents are skipped as the causal ones are.

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
from torch import Tensor

from posenc_cli.attention.kernels import Kernel
from posenc_cli.attention.state import AttentionState
from posenc_cli.positional.base import Documents
from posenc_cli.positional.span import FULL, Span

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


def document_block_mask(documents: Documents, causal: bool, span: Span) -> object:
    """The BlockMask of `document_mask_mod`, one per row (B, shared by the heads)."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, T = documents.segment.shape
    mod = document_mask_mod(documents, causal, span)
    return create_block_mask(mod, B, None, T, T, device=str(documents.segment.device))


@functools.lru_cache(maxsize=16)
def block_mask(length: int, causal: bool, span: Span, device: str) -> object | None:
    """The BlockMask of `mask_mod` for `length` queries and keys (shared by every batch row and head; spans follow
    token order, so it depends on these four facts only), built once per (length, causal, span, device)."""
    from torch.nn.attention.flex_attention import create_block_mask

    mod = mask_mod(causal, span)
    return None if mod is None else create_block_mask(mod, None, None, length, length, device=device)


@functools.cache
def _compiled() -> Callable[..., Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

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
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention
