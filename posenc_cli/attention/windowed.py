"""Kernels for a layer whose span hides keys (`positional.span`: sliding window W, chunks of C tokens).

- `Windowed`: queries in chunks; chunk [s, e) scores only the keys any of its queries can see, [first_key(s), e)
  (causal), with the scheme's bias when it has one and the span and causal masks folded in. A chunk holds
  n·(n + W) scores, n sized from `BIAS_CHUNK_BYTES`, so memory is linear in T for a fixed window, and no T×T mask
  exists at any length.
- `BlockCausal`: a chunked span without a bias. Attention never crosses a block boundary, so the blocks are the
  batch: q, k, v (B, H, T, hd), padded to a whole number of blocks, become (B·T/C, H, C, hd) and take SDPA's
  fused causal kernel in one call. The padding rows come after every real query of the last block, so causality
  hides them; their outputs are cut off. Not for packed rows (`PositionContext.documents`): a document's chunks
  start at its first token, not at multiples of C, so those take `Windowed`, which folds the document mask in.

`choose.choose_kernel` takes them only when the span hides something at this length (`Span.covers`): a window at
least as long as the sequence is plain causal attention, and takes the plain roads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc_cli.attention.kernels import document_first_key, fold_causal_mask
from posenc_cli.attention.state import AttentionState, Kernel
from posenc_cli.positional.span import Span


@dataclass(frozen=True)
class Windowed(Kernel):
    """The span's visible keys per chunk of `chunk` queries, the scheme's bias (if any) and both masks folded."""

    span: Span
    chunk: int
    causal: bool = True
    dropout_p: float = 0.0

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, state: AttentionState, layer: int) -> Tensor:
        T = q.shape[2]
        scheme, ctx = state.scheme, state.ctx
        pos = ctx.token_index  # (T,) token order: the causal mask, the span and the chunks
        outs = []
        for start in range(0, T, self.chunk):
            end = min(start + self.chunk, T)
            # keys no query of the chunk sees: out (packed rows: spans count from each document's first token, and
            # no key of an earlier document is seen)
            lo = max(self.span.first_key(start, ctx.documents is None), document_first_key(state, start))
            hi = end if self.causal else T
            qc, kc, vc = q[:, :, start:end], k[:, :, lo:hi], v[:, :, lo:hi]  # (B, H, Tq|Tk, hd)
            q_pos, k_pos = pos[start:end], pos[lo:hi]
            bias = scheme.bias(layer, qc, kc, q_pos, k_pos, ctx) if scheme.has_bias else None  # (B, H, Tq, Tk)
            mask = fold_causal_mask(bias, q_pos, k_pos, q.dtype, self.causal, self.span, ctx.documents)
            outs.append(F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, dropout_p=self.dropout_p))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


@dataclass(frozen=True)
class BlockCausal(Kernel):
    """Causal attention within blocks of `size` tokens, no bias: one fused SDPA call over the blocks as a batch."""

    size: int
    dropout_p: float = 0.0

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, state: AttentionState, layer: int) -> Tensor:
        B, H, T, _ = q.shape
        C = self.size
        n = -(-T // C)  # blocks, the last one padded
        outs = []
        for x in (q, k, v):  # each at its own width: a scheme may widen q and k beyond v's (a polar one: 2·hd)
            d = x.shape[-1]
            if n * C != T:
                x = torch.cat([x, x.new_zeros(B, H, n * C - T, d)], dim=2)  # (B, H, n·C, d)
            outs.append(x.view(B, H, n, C, d).transpose(1, 2).reshape(B * n, H, C, d))  # (B·n, H, C, d)
        y = F.scaled_dot_product_attention(*outs, dropout_p=self.dropout_p, is_causal=True)  # (B·n, H, C, dv)
        dv = v.shape[-1]
        y = y.view(B, n, H, C, dv).transpose(1, 2).reshape(B, H, n * C, dv)  # (B, H, n·C, dv)
        return y[:, :, :T]
