"""The attention kernels: one interface, one road each, chosen once per forward by `choose.choose_kernel`.

A kernel is a small frozen dataclass holding what was decided for this forward (causal, chunk, dropout, first
query row) and computing softmax(q·kᵀ/√hd + bias + mask)·v as `kernel(q, k, v, state, layer)`: q (B, H, T − q_start,
hd) the query rows [q_start, T) (all T by default), k, v (B, H, T, hd) -> (B, H, T − q_start, hd). `state`
(`AttentionState`) gives the scheme, its context and the tables built once per forward. The roads:

- `Fused`: no bias: one fused `scaled_dot_product_attention` call with `is_causal`.
- `Masked`: no bias, packed rows: SDPA within the documents by query chunks, each against the keys from its
  documents' first token on, with a boolean mask (`attend_documents`).
- `KeyBias`: a key-only bias b_h(j) with bias_h(i, j) = b_h(j) + c_h(i) (e.g. a linear distance penalty
  −m_h·(i − j) = m_h·j − m_h·i), added through SDPA's fused causal kernel by augmenting the head dimension:
  q' = [q, 1], k' = [k, b·√hd], v' = [v, 0] (the fused CPU kernel needs equal head dims), with the scale 1/√hd
  passed explicitly, so q'·k'ᵀ/√hd = q·kᵀ/√hd + b_h(j); the per-row constant c_h(i) leaves each softmax row
  unchanged. No bias or mask tensor is built, and memory stays linear in T. The score carries an absolute rounding
  error of about eps·max|b| (b is centred per head to halve it; a slope-1/2 penalty at T = 8192: ~2e-4, tested), too
  coarse in bf16, so it is chosen for fp32/fp64 on `KEY_BIAS_DEVICES` only.
- `SharedMask`: a bias every layer shares, in one chunk: bias + causal mask built once per forward.
- `ChunkedBias`: the causal mask folded into the bias (−inf where key position > query position), queries in
  chunks: chunk c of queries [s, e) only sees keys [0, e), so no full-length score or bias tensor ever exists once
  the (B, H, T, T) bias would exceed `BIAS_CHUNK_BYTES`. The Python loop runs over chunks of queries, never tokens.
- `Rows`, `LastRow`: decoding with a KV cache, only the query rows [q_start, T) against every key, as one query
  chunk of the bias road (`LastRow`: one row without a bias sees every key, so no mask).
- `Remapped`: position remapping (Self-Extend, ReRoPE: a scheme with `remap_window` W > 0): two score matrices,
  the normal one and the one of the scheme's remapped q and k, merged before the softmax (normal where the id
  distance i − j < W), in query chunks like the bias road.
- `Windowed`, `BlockCausal` (`attention.windowed`): a layer whose span is a sliding window or fixed chunks
  (`positional.span`); the KV-cache rows and `Remapped` take the span's mask too.
- `Scored` (`attention.scored`): a scheme that owns the logits or the normaliser (`PositionalScheme.owns_scores`:
  Householder products between key and query, stick-breaking's weights): weights·v by query chunks, for the full
  forward and the KV-cache rows.
- `InFp32`: another kernel run in fp32 with autocast off, the result cast back (bf16 training on CPU, see
  `choose.FP32_GRAD_DEVICES`).

Packed rows (`PositionContext.documents`, `positional.base.Documents`): every road of a full forward hides the keys
of other documents and applies the span at each token's index within its document: the bias roads fold it into
their additive mask per chunk (`fold_causal_mask`, (B, 1 or H, chunk, Tk)), `Masked` and `KeyBias` call SDPA by
query chunks with a boolean mask, skipping the keys of earlier documents (`attend_documents`), and `Scored`,
`Windowed` and `flex.Flex` take it beside the span.
Never a (B, H, T, T) tensor that the bias itself would not need. The KV cache's rows see documents when prompts of
different lengths are left-padded (`kv_cache`): `Rows` folds them into its mask; `LastRow`, without a mask, is then
not taken.

Position ids (see `posenc_cli.positional.base`): the causal mask and the chunks follow token order, always; the
bias hooks receive token indexes and read the chunk's ids from the context, so with per-token ids the chunked road
still builds only (B, H, chunk, T) biases, and `key_bias` may be per row, (B, H, T).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc_cli.attention.state import AttentionState, Kernel
from posenc_cli.options.attn_sinks import sink_softmax
from posenc_cli.positional.base import Documents, PositionContext, relative_distance
from posenc_cli.positional.span import FULL, Span


@dataclass(frozen=True)
class Fused(Kernel):
    """No bias: SDPA's fused kernel, causal or not."""

    causal: bool = True
    dropout_p: float = 0.0

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, state: AttentionState, layer: int) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout_p, is_causal=self.causal)


@dataclass(frozen=True)
class Masked(Kernel):
    """No bias, packed rows (`PositionContext.documents`): SDPA within the documents, by chunks of `chunk` queries
    that score only the keys from their documents' first token on (`attend_documents`)."""

    chunk: int
    causal: bool = True
    dropout_p: float = 0.0

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, state: AttentionState, layer: int) -> Tensor:
        return attend_documents(q, k, v, state, self.chunk, self.causal, self.dropout_p)


@dataclass(frozen=True)
class KeyBias(Kernel):
    """Causal, with the scheme's key-only bias (`state.key_bias`) through the fused kernel (`attend_key_bias`); in
    packed rows (`chunk` set) the same augmented q, k, v within the documents (`attend_documents`)."""

    dropout_p: float = 0.0
    chunk: int | None = None

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, state: AttentionState, layer: int) -> Tensor:
        if self.chunk is None:
            return attend_key_bias(q, k, v, state.key_bias(), dropout_p=self.dropout_p)
        hd = q.shape[-1]
        qa, ka, va = key_bias_inputs(q, k, v, state.key_bias())  # (B, H, T, hd + 1) each
        out = attend_documents(qa, ka, va, state, self.chunk, True, self.dropout_p, scale=hd**-0.5)
        return out[..., :hd]  # (B, H, T, hd)


@dataclass(frozen=True)
class SharedMask(Kernel):
    """One chunk, a bias shared by every layer: bias + mask folded once per forward (`state.masks`), then SDPA."""

    causal: bool = True
    dropout_p: float = 0.0

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, state: AttentionState, layer: int) -> Tensor:
        pos = state.ctx.token_index  # (T,) token order: the causal mask; hooks look the ids up (`ctx.ids_at`)
        key = (q.dtype, self.causal, q.shape[2])
        if key not in state.masks:
            bias = state.scheme.bias(layer, q, k, pos, pos, state.ctx)  # broadcastable to (B, H, T, T)
            state.masks[key] = fold_causal_mask(bias, pos, pos, q.dtype, self.causal, documents=state.ctx.documents)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=state.masks[key], dropout_p=self.dropout_p)


@dataclass(frozen=True)
class ChunkedBias(Kernel):
    """The scheme's `bias` hook per chunk of `chunk` queries, with the causal mask folded in."""

    chunk: int
    causal: bool = True
    dropout_p: float = 0.0

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, state: AttentionState, layer: int) -> Tensor:
        T = q.shape[2]
        pos = state.ctx.token_index  # (T,) token order: the causal mask and the chunks
        outs = []
        for start in range(0, T, self.chunk):
            end = min(start + self.chunk, T)
            # Causal: queries [start, end) attend to keys [0, end) only; the rest of the keys are all masked.
            # Packed rows: keys before the chunk's documents are masked too (`document_first_key`).
            lo, k_end = document_first_key(state, start), end if self.causal else T
            qc = q[:, :, start:end]  # (B, H, Tq, hd)
            kc, vc = k[:, :, lo:k_end], v[:, :, lo:k_end]  # (B, H, Tk, hd)
            q_pos, k_pos = pos[start:end], pos[lo:k_end]
            bias = state.scheme.bias(layer, qc, kc, q_pos, k_pos, state.ctx)  # broadcastable to (B, H, Tq, Tk)
            mask = fold_causal_mask(bias, q_pos, k_pos, q.dtype, self.causal, documents=state.ctx.documents)
            outs.append(F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, dropout_p=self.dropout_p))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


@dataclass(frozen=True)
class Rows(Kernel):
    """Causal attention of the query rows [q_start, T) against all T keys (KV cache decoding): one query chunk of
    the bias road (the scheme's `bias` hook, as in the full forward's chunks), or SDPA with the causal rows of the
    mask for a scheme without a bias."""

    q_start: int
    dropout_p: float = 0.0
    span: Span = FULL

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, state: AttentionState, layer: int) -> Tensor:
        pos, docs = state.ctx.token_index, state.ctx.documents
        q_pos = pos[self.q_start :]  # q: (B, H, Tq, hd), those rows
        # keys before it are hidden from every row (full span: 0; left pads: chunks start at each row's first token)
        lo = self.span.first_key(self.q_start, docs is None)
        k, v, k_pos = k[:, :, lo:], v[:, :, lo:], pos[lo:]  # (B, H, T − lo, hd)
        scheme = state.scheme
        bias = scheme.bias(layer, q, k, q_pos, k_pos, state.ctx) if scheme.has_bias else None  # (B, H, Tq, T − lo)
        mask = fold_causal_mask(bias, q_pos, k_pos, q.dtype, True, self.span, docs)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout_p)


@dataclass(frozen=True)
class LastRow(Kernel):
    """The last query row alone, without a bias: it sees every key, so SDPA needs no mask."""

    q_start: int
    dropout_p: float = 0.0

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, state: AttentionState, layer: int) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout_p)  # q: (B, H, 1, hd)


@dataclass(frozen=True)
class Remapped(Kernel):
    """softmax(merged scores + bias + mask)·v for a remapping scheme, the query rows [q_start, T).

    By query chunks: each holds two (B, H, chunk, Tk) fp32 score tensors, so the chunk is sized for half of
    `BIAS_CHUNK_BYTES`. The remapped q and k are computed once per layer (elementwise rotations, (B, H, T, hd)):
    query rows from q_start on are padded back to T with zero rows first (the scheme's `remap` takes all T).
    `sinks`: the layer's trained sink logits (`state.sinks`) join each row's softmax (`sink_softmax`).
    """

    chunk: int
    causal: bool = True
    dropout_p: float = 0.0
    q_start: int = 0
    span: Span = FULL
    sinks: bool = False

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, state: AttentionState, layer: int) -> Tensor:
        scheme, ctx = state.scheme, state.ctx
        B, H, _, hd = q.shape
        if self.q_start:  # rows [0, q_start) are never read
            q = torch.cat([q.new_zeros(B, H, self.q_start, hd), q], dim=2)  # (B, H, T, hd)
        T = q.shape[2]
        q2, k2 = scheme.remap(q, k, ctx)  # (B, H, T, hd) each
        pos = ctx.token_index
        outs = []
        for start in range(self.q_start, T, self.chunk):
            end = min(start + self.chunk, T)
            k_end = end if self.causal else T  # causal: later keys are all masked
            scores = merged_scores(q, k, q2, k2, scheme.remap_window, ctx, start, end, k_end)  # (B, H, Tq, Tk)
            q_pos, k_pos = pos[start:end], pos[:k_end]
            qc, kc = q[:, :, start:end], k[:, :, :k_end]
            bias = scheme.bias(layer, qc, kc, q_pos, k_pos, ctx) if scheme.has_bias else None
            mask = fold_causal_mask(bias, q_pos, k_pos, torch.float32, self.causal, self.span, ctx.documents)
            scores = scores + mask
            probs = sink_softmax(scores, state.sinks[layer]) if self.sinks else torch.softmax(scores, dim=-1)
            if self.dropout_p > 0:
                probs = F.dropout(probs, self.dropout_p)
            outs.append(probs.to(v.dtype) @ v[:, :, :k_end])  # (B, H, Tq, hd)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


@dataclass(frozen=True)
class InFp32(Kernel):
    """`inner` on fp32 copies of q, k, v with autocast off (autocast would cast SDPA's inputs back to bf16); the
    result is cast back to q's dtype."""

    inner: Kernel

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, state: AttentionState, layer: int) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):
            out = self.inner(q.float(), k.float(), v.float(), state, layer)
        return out.to(q.dtype)


# -- the maths the kernels share ---------------------------------------------------------------------------------


def fold_causal_mask(
    bias: Tensor | None,
    q_pos: Tensor,
    k_pos: Tensor,
    dtype: torch.dtype,
    causal: bool,
    span: Span = FULL,
    documents: Documents | None = None,
) -> Tensor:
    """Additive mask for SDPA: `bias` (broadcastable to (B, H, Tq, Tk)) in `dtype`, −inf where k_pos > q_pos
    (causal) and where the layer's `span` hides the key (`Span.visible`); with `documents` (packed rows), also
    where the key is in another document, and the span at the tokens' indexes within their document
    (`Documents.visible`: the mask gains a batch dimension, (B, 1, Tq, Tk) at least).

    Returns a 4-D tensor (SDPA needs the mask in the query's dtype; under bf16 autocast q is bf16).
    """
    if bias is None:
        bias = torch.zeros(q_pos.shape[0], k_pos.shape[0], device=q_pos.device, dtype=dtype)
    bias = bias.to(dtype)
    hidden = k_pos[None, :] > q_pos[:, None] if causal else None  # (Tq, Tk) the future
    # (Tq, Tk), (B, 1, Tq, Tk) for packed rows, or None
    visible = span.visible(q_pos, k_pos) if documents is None else documents.visible(q_pos, k_pos, span)
    if visible is not None:
        hidden = ~visible if hidden is None else hidden | ~visible
    if hidden is not None:
        bias = torch.where(hidden, float("-inf"), bias)  # one pass; never writes into the scheme's tensor
    while bias.dim() < 4:
        bias = bias.unsqueeze(0)
    return bias


def document_first_key(state: AttentionState, start: int) -> int:
    """The first key any query at or after token `start` may see in packed rows: the earliest first token, over the
    rows, of query `start`'s document (`AttentionState.document_starts`); 0 without documents."""
    return 0 if state.ctx.documents is None else state.document_starts()[start]


def attend_key_bias(q: Tensor, k: Tensor, v: Tensor, key_bias: Tensor, dropout_p: float = 0.0) -> Tensor:
    """Causal softmax(q·kᵀ/√hd + b_h(j))·v through SDPA's fused causal kernel; q, k, v (B, H, T, hd), key_bias (H, T)
    or, per row, (B, H, T).

    q' = [q, 1], k' = [k, (b − centre_h)·√hd], v' = [v, 0], head dim hd + 1 (`key_bias_inputs`); scale = 1/√hd
    explicitly, so q'·k'ᵀ·scale = q·kᵀ/√hd + b_h(j) − centre_h. Subtracting a per-head constant (the midpoint of b's
    range) changes no softmax row and halves the largest |score| that rounding sees. (Padding hd + 1 up to a multiple
    of 8 was measured: no faster on CPU, more memory.)
    """
    hd = q.shape[-1]
    qa, ka, va = key_bias_inputs(q, k, v, key_bias)
    out = F.scaled_dot_product_attention(qa, ka, va, dropout_p=dropout_p, is_causal=True, scale=hd**-0.5)
    return out[..., :hd]  # (B, H, T, hd)


def key_bias_inputs(q: Tensor, k: Tensor, v: Tensor, key_bias: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v (B, H, T, hd), key_bias (H, T) or (B, H, T) -> q', k', v' (B, H, T, hd + 1) of `attend_key_bias`."""
    B, H, T, hd = q.shape
    b = key_bias.to(q.dtype)
    b = b - (b.amax(dim=-1, keepdim=True) + b.amin(dim=-1, keepdim=True)) / 2  # (H, T) or (B, H, T), centred per head
    col = (b * hd**0.5)[..., None].expand(B, H, T, 1)  # (B, H, T, 1)
    qa = torch.cat([q, q.new_ones(()).expand(B, H, T, 1)], dim=-1)  # (B, H, T, hd + 1)
    ka = torch.cat([k, col], dim=-1)  # (B, H, T, hd + 1)
    va = torch.cat([v, v.new_zeros(()).expand(B, H, T, 1)], dim=-1)  # (B, H, T, hd + 1)
    return qa, ka, va


def attend_documents(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: AttentionState,
    chunk: int,
    causal: bool = True,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """SDPA within the documents of packed rows, q, k, v (B, H, T, d) -> (B, H, T, d), by chunks of `chunk` queries:
    chunk [s, e) scores the keys [first, e) (causal; [first, T) otherwise), `first` the earliest first token, over the
    rows, of query s's document (`AttentionState.document_starts`), so keys of earlier documents are never scored,
    and a boolean (B, 1, Tq, Tk) mask hides the rest. A row no longer than `chunk`: one call with the forward's
    (B, 1, T, T) mask (`AttentionState.document_mask`)."""
    T = q.shape[2]
    if chunk >= T:
        mask = state.document_mask(causal)  # (B, 1, T, T) bool, True: attend
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    docs, pos = state.ctx.documents, state.ctx.token_index
    assert docs is not None  # the rule takes this road only for packed rows
    first = state.document_starts()
    outs = []
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        lo, hi = first[start], end if causal else T  # as `document_first_key`
        q_pos, k_pos = pos[start:end], pos[lo:hi]
        seen = docs.visible(q_pos, k_pos)  # (B, 1, Tq, Tk)
        if causal:
            seen = seen & (k_pos[None, :] <= q_pos[:, None])
        qc, kc, vc = q[:, :, start:end], k[:, :, lo:hi], v[:, :, lo:hi]  # (B, H, Tq|Tk, d)
        outs.append(F.scaled_dot_product_attention(qc, kc, vc, attn_mask=seen, dropout_p=dropout_p, scale=scale))
    return torch.cat(outs, dim=2)


def merged_scores(
    q: Tensor, k: Tensor, q2: Tensor, k2: Tensor, window: int, ctx: PositionContext, start: int, end: int, k_end: int
) -> Tensor:
    """fp32 scores (B, H, Tq, Tk) of queries [start, end) against keys [0, k_end), no mask: q·kᵀ/√hd where the id
    distance i − j < `window`, q2·k2ᵀ/√hd (the remapped q and k, `PositionalScheme.remap`) elsewhere.

    With the default ids (token index = id) each product is computed only where some query of the chunk needs it:
    keys [0, start − W] are far from every query (remapped only), keys [end − W, k_end) near every one (normal
    only), and only the band between takes both and the mask. Explicit ids compare every pair.
    """
    pos = ctx.token_index
    if ctx.index is not None:  # explicit ids: distances by id, both products over every key
        normal = (q[:, :, start:end] @ k[:, :, :k_end].transpose(-1, -2)).float()  # (B, H, Tq, Tk)
        remapped = (q2[:, :, start:end] @ k2[:, :, :k_end].transpose(-1, -2)).float()  # (B, H, Tq, Tk)
        near = relative_distance(ctx.ids_at(pos[start:end]), ctx.ids_at(pos[:k_end])) < window  # (Tq|B,Tq, Tk)
        near = near if near.dim() == 2 else near[:, None]  # (B, 1, Tq, Tk) for per-row ids
        return torch.where(near, normal, remapped) * q.shape[-1] ** -0.5
    lo, hi = max(0, start - window + 1), min(k_end, max(0, end - window))  # the band [lo, hi): mixed; lo <= hi
    B, H, _, hd = q.shape
    scores = torch.empty(B, H, end - start, k_end, dtype=torch.float32, device=q.device)  # (B, H, Tq, Tk)
    if hi > 0:  # keys [0, hi): far from some query of the chunk
        scores[..., :hi] = q2[:, :, start:end] @ k2[:, :, :hi].transpose(-1, -2)
    if lo < k_end:  # keys [lo, k_end): near some query of the chunk
        normal = (q[:, :, start:end] @ k[:, :, lo:k_end].transpose(-1, -2)).float()  # (B, H, Tq, k_end − lo)
        if hi > lo:
            near = relative_distance(pos[start:end], pos[lo:hi]) < window  # (Tq, hi − lo)
            scores[..., lo:hi] = torch.where(near, normal[..., : hi - lo], scores[..., lo:hi])
        scores[..., hi:] = normal[..., hi - lo :]
    return scores * hd**-0.5
