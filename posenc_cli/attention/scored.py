"""The road of a scheme that owns the attention scores (`PositionalScheme.owns_scores`): its own logits (Householder
products between key and query), its own normaliser (stick-breaking), or both.

No fused kernel can run such a scheme, so `Scored` computes weights·v itself, by chunks of queries like the bias
road: chunk [s, e) of the query rows scores the keys it can see, [span.first_key(s), e) causally, so memory stays
(B, H, chunk, T) and no full-length score tensor exists beyond `BIAS_CHUNK_BYTES` (a windowed layer's chunks are
sized from its span, n·(n + W) scores each, as `Windowed`'s: `choose.choose_kernel`). Per chunk:

1. logits: the scheme's `logits` hook, or q·kᵀ/√hd plus the scheme's `bias` (if it has one), in fp32;
2. visible: the causal mask and the layer's span (`Span.visible`), (Tq, Tk) bool; in packed rows also the
   query's own document, (B, 1, Tq, Tk) (`positional.base.Documents`);
3. weights: the scheme's `normalise` hook (the softmax over the visible keys by default), dropout, then ·v; with
   trained sinks (`sinks`, `model.attn_sinks`) the softmax over the visible keys and the head's sink logit
   (`options.attn_sinks.sink_softmax`; a scheme with its own normaliser is refused sinks when the model is built).

It serves the full forward (q_start = 0) and KV-cache decoding (q_start > 0: the new rows against every key)
alike, so the cached and uncached logits agree as the other roads' do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc_cli.attention.kernels import document_first_key
from posenc_cli.attention.state import AttentionState, Kernel
from posenc_cli.options.attn_sinks import sink_softmax
from posenc_cli.positional.base import Documents, PositionalScheme, PositionContext
from posenc_cli.positional.span import FULL, Span


@dataclass(frozen=True)
class Scored(Kernel):
    """weights·v with the scheme's logits and/or normaliser, the query rows [q_start, T), by chunks of `chunk`."""

    chunk: int
    causal: bool = True
    dropout_p: float = 0.0
    q_start: int = 0
    span: Span = FULL
    sinks: bool = False

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, state: AttentionState, layer: int) -> Tensor:
        scheme, ctx = state.scheme, state.ctx
        T = k.shape[2]
        pos = ctx.token_index  # (T,) token order: the causal mask, the span and the chunks
        outs = []
        for start in range(self.q_start, T, self.chunk):
            end = min(start + self.chunk, T)
            # keys before lo are hidden from every row (packed rows: spans count from each document's first token,
            # and no key of an earlier document is seen)
            lo = self.span.first_key(start, ctx.documents is None) if self.causal else 0
            lo = max(lo, document_first_key(state, start))
            k_end = end if self.causal else T  # causal: later keys are all masked
            q_pos, k_pos = pos[start:end], pos[lo:k_end]
            qc = q[:, :, start - self.q_start : end - self.q_start]  # (B, H, Tq, hd)
            kc, vc = k[:, :, lo:k_end], v[:, :, lo:k_end]  # (B, H, Tk, hd)
            logits = chunk_logits(scheme, layer, qc, kc, q_pos, k_pos, ctx)  # (B, H, Tq, Tk) fp32
            visible = visible_keys(q_pos, k_pos, self.causal, self.span, ctx.documents)  # (Tq, Tk) | (B, 1, Tq, Tk)
            if self.sinks:
                weights = sink_softmax(logits.masked_fill(~visible, float("-inf")), state.sinks[layer])
            else:
                weights = scheme.normalise(layer, logits, q_pos, k_pos, visible, ctx)  # (B, H, Tq, Tk)
            if self.dropout_p > 0:
                weights = F.dropout(weights, self.dropout_p)
            outs.append(weights.to(v.dtype) @ vc)  # (B, H, Tq, hd)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def chunk_logits(
    scheme: PositionalScheme, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, ctx: PositionContext
) -> Tensor:
    """fp32 logits (B, H, Tq, Tk) of one chunk: the scheme's `logits` hook, else q·kᵀ/√hd plus its `bias`."""
    if "logits" in scheme.hooks:
        return scheme.logits(layer, q, k, q_pos, k_pos, ctx).float()
    logits = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5  # (B, H, Tq, Tk)
    if scheme.has_bias:
        bias = scheme.bias(layer, q, k, q_pos, k_pos, ctx)
        if bias is not None:
            logits = logits + bias.float()
    return logits


def visible_keys(q_pos: Tensor, k_pos: Tensor, causal: bool, span: Span, documents: Documents | None = None) -> Tensor:
    """(Tq,), (Tk,) token indexes -> bool (Tq, Tk): True where query i may see key j (causality and `span`); with
    `documents` (packed rows) (B, 1, Tq, Tk): also only keys of the query's document, the span at indexes within it
    (`Documents.visible`)."""
    if causal:
        visible = k_pos[None, :] <= q_pos[:, None]
    else:
        visible = torch.ones(q_pos.shape[0], k_pos.shape[0], dtype=torch.bool, device=q_pos.device)
    shown = span.visible(q_pos, k_pos) if documents is None else documents.visible(q_pos, k_pos, span)
    return visible if shown is None else visible & shown
