"""Yesterday's attention, frozen: `posenc_cli/attention.py` as of commit b170c24 (unchanged up to f28e910), before
the kernels were split out (issue #30 item 3), kept verbatim as the reference the kernels must equal bit for bit
(`test_kernel_equivalence.py`). Only the docstrings and the layer's methods (turned into `legacy_forward`, which
runs on a `CausalSelfAttention`'s own weights) differ from that file. Do not edit the maths here: it is what
"behaviour unchanged" is measured against.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc_cli.kv_cache import KVCache
from posenc_cli.positional.base import PositionalScheme, PositionContext, per_head, relative_distance

# Budget for one chunk's fp32 bias, (B, H, chunk, T) · 4 bytes. SDPA's math path allocates a few tensors of the same
# size (scores, softmax), so the transient peak is a small multiple of this.
BIAS_CHUNK_BYTES = 64 * 2**20
# Devices on which an available `key_bias` replaces the chunked bias path (fp32/fp64 only; see the module docstring).
KEY_BIAS_DEVICES: tuple[str, ...] = ("cpu",)
# Where SDPA's backward is slower in bf16 than in fp32, training under bf16 autocast attends in fp32 (forward-only
# calls stay in bf16). PyTorch's fused CPU kernel, AMD EPYC with AVX512-BF16, H=4, hd=32, one thread, forward and
# backward: bf16 took 2.7x the fp32 time at T=64, 1.9x at 128, 1.3x at 256, 1.0x at 512 and 0.7x at 1024 (so up to
# FP32_GRAD_MAX_LEN only); a model=tiny training step at T=128 drops to 0.64-0.74x (benchmarks/ab_step.py).
FP32_GRAD_DEVICES: tuple[str, ...] = ("cpu",)
FP32_GRAD_MAX_LEN = 256
_KEY_BIAS = "attention.key_bias"  # ctx.tables entries this module caches per forward
_MASKS = "attention.masks"
_LOGN = "attention.logn"
_SSMAX = "attention.ssmax"
_MIN_ID = "attention.min_id"


def logn_factor(positions: Tensor, length: int) -> Tensor:
    """Qwen's `use_logn_attn`: max(1, log(n)/log(L)) fp32 for n = position id + 1, shaped like `positions` (T,) or
    (B, T). Identity (1) at n ≤ L; multiplying q by it multiplies query n's logits by it."""
    n = positions.to(torch.float32) + 1
    return (n.log() / math.log(length)).clamp_min(1.0)


def ssmax_factor(token_index: Tensor) -> Tensor:
    """log(n) fp32 (T,) for n = token index + 1, the number of keys a causal query sees (Nakanishi 2025, SSMax:
    logits × s·log n, s a trained parameter per head)."""
    return (token_index.to(torch.float32) + 1).log()


def bias_chunk_size(batch: int, n_head: int, k_len: int, budget: int | None = None) -> int:
    """Queries per chunk so that a (batch, n_head, chunk, k_len) fp32 tensor fits in `budget` (BIAS_CHUNK_BYTES)."""
    budget = BIAS_CHUNK_BYTES if budget is None else budget
    return max(1, budget // (4 * batch * n_head * k_len))


def fold_causal_mask(bias: Tensor | None, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype, causal: bool) -> Tensor:
    """Additive mask for SDPA: `bias` (broadcastable to (B, H, Tq, Tk)) in `dtype`, −inf where k_pos > q_pos.

    Returns a 4-D tensor (SDPA needs the mask in the query's dtype; under bf16 autocast q is bf16).
    """
    if bias is None:
        bias = torch.zeros(q_pos.shape[0], k_pos.shape[0], device=q_pos.device, dtype=dtype)
    bias = bias.to(dtype)
    if causal:
        future = k_pos[None, :] > q_pos[:, None]  # (Tq, Tk)
        bias = torch.where(future, float("-inf"), bias)  # one pass; never writes into the scheme's tensor
    while bias.dim() < 4:
        bias = bias.unsqueeze(0)
    return bias


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
) -> Tensor:
    """softmax(q·kᵀ/√hd + bias + mask)·v for q, k, v (B, H, T, hd) -> (B, H, T − q_start, hd).

    `chunk_size` forces the number of queries per chunk on the bias path (None: from `BIAS_CHUNK_BYTES`, or the
    key-bias road where the scheme and the dtype allow it). bf16 inputs that need gradients on `FP32_GRAD_DEVICES`
    at most `FP32_GRAD_MAX_LEN` long are attended in fp32 (see there) and the result is cast back to bf16.
    `q_start` > 0 (decoding with a KV cache, causal): only the query rows [q_start, T) are computed, as one query
    chunk of the bias path against every key (rows before q_start are ignored; the fused whole-matrix roads do not
    apply).
    """
    if q.requires_grad and q.dtype == torch.bfloat16 and _fp32_grad(q):
        with torch.autocast(q.device.type, enabled=False):  # autocast would cast SDPA's inputs back to bf16
            out = attend(
                q.float(),
                k.float(),
                v.float(),
                scheme,
                layer,
                ctx,
                causal=causal,
                dropout_p=dropout_p,
                chunk_size=chunk_size,
                q_start=q_start,
            )
        return out.to(q.dtype)
    if scheme.remap_window and remap_applies(scheme.remap_window, ctx):
        return attend_remapped(
            q, k, v, scheme, layer, ctx, causal=causal, dropout_p=dropout_p, chunk_size=chunk_size, q_start=q_start
        )
    if q_start:
        return attend_rows(q, k, v, scheme, layer, ctx, q_start, dropout_p=dropout_p)
    if not scheme.has_bias:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
    if causal and chunk_size is None and key_bias_applies(q):
        kb = cached_key_bias(scheme, ctx)
        if kb is not None:
            return attend_key_bias(q, k, v, kb, dropout_p=dropout_p)
    B, H, T, _ = q.shape
    pos = ctx.token_index  # (T,) token order: the causal mask and the chunks; hooks look the ids up (`ctx.ids_at`)
    chunk = chunk_size if chunk_size is not None else bias_chunk_size(B, H, T)
    if chunk >= T and scheme.bias_shared_across_layers:  # one chunk: build bias + mask once per forward
        key = (q.dtype, causal, T)
        masks = ctx.tables.setdefault(_MASKS, {})
        if key not in masks:
            masks[key] = fold_causal_mask(scheme.bias(layer, q, k, pos, pos, ctx), pos, pos, q.dtype, causal)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=masks[key], dropout_p=dropout_p)
    outs = []
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        # Causal: queries [start, end) attend to keys [0, end) only; the rest of the keys are all masked.
        k_end = end if causal else T
        qc = q[:, :, start:end]  # (B, H, Tq, hd)
        kc, vc = k[:, :, :k_end], v[:, :, :k_end]  # (B, H, Tk, hd)
        q_pos, k_pos = pos[start:end], pos[:k_end]
        bias = scheme.bias(layer, qc, kc, q_pos, k_pos, ctx)  # broadcastable to (B, H, Tq, Tk)
        mask = fold_causal_mask(bias, q_pos, k_pos, q.dtype, causal)
        outs.append(F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, dropout_p=dropout_p))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def attend_rows(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scheme: PositionalScheme,
    layer: int,
    ctx: PositionContext,
    q_start: int,
    *,
    dropout_p: float = 0.0,
) -> Tensor:
    """Causal attention of the query rows [q_start, T) against all T keys: q, k, v (B, H, T, hd) -> (B, H, T −
    q_start, hd). The rows are one query chunk of the bias path (the scheme's `bias` hook, as in the full forward's
    chunks), or, without a bias, SDPA with the causal rows of the mask."""
    T = q.shape[2]
    pos = ctx.token_index
    qc = q[:, :, q_start:]  # (B, H, Tq, hd)
    q_pos = pos[q_start:]
    if T - q_start == 1 and not scheme.has_bias:  # one query row: it sees every key
        return F.scaled_dot_product_attention(qc, k, v, dropout_p=dropout_p)
    bias = scheme.bias(layer, qc, k, q_pos, pos, ctx) if scheme.has_bias else None  # broadcastable to (B, H, Tq, T)
    mask = fold_causal_mask(bias, q_pos, pos, q.dtype, True)
    return F.scaled_dot_product_attention(qc, k, v, attn_mask=mask, dropout_p=dropout_p)


def remap_applies(window: int, ctx: PositionContext) -> bool:
    """Whether some pair of ids is at least `window` apart (else every pair takes the normal score: plain road)."""
    if ctx.max_position is None:
        return ctx.seq_len > window  # ids 0..T−1: the largest distance is T − 1
    if _MIN_ID not in ctx.tables:  # one host sync per forward, shared by the layers
        ctx.tables[_MIN_ID] = int(ctx.positions.min())
    return ctx.max_position - ctx.tables[_MIN_ID] >= window


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


def attend_remapped(
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
) -> Tensor:
    """softmax(merged scores + bias + mask)·v for a remapping scheme, q, k, v (B, H, T, hd) -> (B, H, T − q_start,
    hd): the query rows [q_start, T) (all of them by default).

    By query chunks: each holds two (B, H, chunk, Tk) fp32 score tensors, so the chunk is sized for half of
    `BIAS_CHUNK_BYTES`. The remapped q and k are computed once per layer (elementwise rotations, (B, H, T, hd)).
    """
    B, H, T, _ = q.shape
    chunk = chunk_size if chunk_size is not None else bias_chunk_size(B, H, T, BIAS_CHUNK_BYTES // 2)
    q2, k2 = scheme.remap(q, k, ctx)  # (B, H, T, hd) each
    pos = ctx.token_index
    outs = []
    for start in range(q_start, T, chunk):
        end = min(start + chunk, T)
        k_end = end if causal else T  # causal: later keys are all masked
        scores = merged_scores(q, k, q2, k2, scheme.remap_window, ctx, start, end, k_end)  # (B, H, Tq, Tk)
        q_pos, k_pos = pos[start:end], pos[:k_end]
        bias = scheme.bias(layer, q[:, :, start:end], k[:, :, :k_end], q_pos, k_pos, ctx) if scheme.has_bias else None
        probs = torch.softmax(scores + fold_causal_mask(bias, q_pos, k_pos, torch.float32, causal), dim=-1)
        if dropout_p > 0:
            probs = F.dropout(probs, dropout_p)
        outs.append(probs.to(v.dtype) @ v[:, :, :k_end])  # (B, H, Tq, hd)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def _fp32_grad(q: Tensor) -> bool:
    return q.device.type in FP32_GRAD_DEVICES and q.shape[-2] <= FP32_GRAD_MAX_LEN


def key_bias_applies(q: Tensor) -> bool:
    """Whether the key-bias road is precise and fast for q's dtype and device (fp32/fp64 on `KEY_BIAS_DEVICES`)."""
    return q.device.type in KEY_BIAS_DEVICES and q.dtype in (torch.float32, torch.float64)


def cached_key_bias(scheme: PositionalScheme, ctx: PositionContext) -> Tensor | None:
    """The scheme's `key_bias` (H, T) or (B, H, T) for this forward's positions, computed once per forward (all layers
    share it)."""
    if _KEY_BIAS not in ctx.tables:
        ctx.tables[_KEY_BIAS] = scheme.key_bias(ctx.token_index, ctx)
    return ctx.tables[_KEY_BIAS]


def attend_key_bias(q: Tensor, k: Tensor, v: Tensor, key_bias: Tensor, dropout_p: float = 0.0) -> Tensor:
    """Causal softmax(q·kᵀ/√hd + b_h(j))·v through SDPA's fused causal kernel; q, k, v (B, H, T, hd), key_bias (H, T)
    or, per row, (B, H, T).

    q' = [q, 1], k' = [k, (b − centre_h)·√hd], v' = [v, 0], head dim hd + 1; scale = 1/√hd explicitly, so
    q'·k'ᵀ·scale = q·kᵀ/√hd + b_h(j) − centre_h. Subtracting a per-head constant (the midpoint of b's range) changes
    no softmax row and halves the largest |score| that rounding sees. (Padding hd + 1 up to a multiple of 8 was
    measured: no faster on CPU, more memory.)
    """
    B, H, T, hd = q.shape
    b = key_bias.to(q.dtype)
    b = b - (b.amax(dim=-1, keepdim=True) + b.amin(dim=-1, keepdim=True)) / 2  # (H, T) or (B, H, T), centred per head
    col = (b * hd**0.5)[..., None].expand(B, H, T, 1)  # (B, H, T, 1)
    qa = torch.cat([q, q.new_ones(()).expand(B, H, T, 1)], dim=-1)  # (B, H, T, hd + 1)
    ka = torch.cat([k, col], dim=-1)  # (B, H, T, hd + 1)
    va = torch.cat([v, v.new_zeros(()).expand(B, H, T, 1)], dim=-1)  # (B, H, T, hd + 1)
    out = F.scaled_dot_product_attention(qa, ka, va, dropout_p=dropout_p, is_causal=True, scale=hd**-0.5)
    return out[..., :hd]  # (B, H, T, hd)


def legacy_length_scale(attn: Any, q: Tensor, ctx: PositionContext) -> Tensor:
    """`CausalSelfAttention.length_scale` as it was (the layer's setting now read from its registry entry)."""
    name = None if attn.temperature is None else attn.temperature.name
    if name == "logn":
        if _LOGN not in ctx.tables:  # once per forward, shared by the layers
            ctx.tables[_LOGN] = per_head(logn_factor(ctx.positions, attn.temperature.length)[..., None])  # (.., T, 1)
        return q * ctx.tables[_LOGN].to(q.dtype)
    if name == "ssmax":
        if _SSMAX not in ctx.tables:  # once per forward, shared by the layers
            ctx.tables[_SSMAX] = ssmax_factor(ctx.token_index).to(q.device)  # (T,)
        factor = attn.ssmax_scale.float()[:, None, None] * ctx.tables[_SSMAX][:, None]  # (H, T, 1)
        return q * factor.to(q.dtype)
    return q


def legacy_qkv_heads(
    attn: Any, x: Tensor, scheme: PositionalScheme, ctx: PositionContext, cache: KVCache | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """`CausalSelfAttention.qkv_heads` as it was."""
    B, T, D = x.shape
    q, k, v = attn.qkv(x).split(D, dim=2)  # 3 × (B, T, D)
    q = q.view(B, T, attn.n_head, attn.head_dim).transpose(1, 2)  # (B, H, T, hd)
    k = k.view(B, T, attn.n_head, attn.head_dim).transpose(1, 2)  # (B, H, T, hd)
    v = v.view(B, T, attn.n_head, attn.head_dim).transpose(1, 2)  # (B, H, T, hd)
    if cache is not None:
        k, v = cache.append(attn.layer, k, v)  # (B, H, Tc + T, hd), unrotated keys
        if k.shape[2] > T:  # rotate q at the new tokens' positions: rows line up with the context's
            q = torch.cat([q.new_zeros(B, attn.n_head, k.shape[2] - T, attn.head_dim), q], dim=2)
    q, k = scheme.rotate(q, k, ctx)
    return legacy_length_scale(attn, q, ctx), k, v


def legacy_forward(
    attn: Any,
    x: Tensor,
    scheme: PositionalScheme,
    ctx: PositionContext,
    causal: bool = True,
    cache: KVCache | None = None,
    state: object = None,
    span: object = None,
    temperature: object = None,
    options: object = None,
) -> Tensor:
    """`CausalSelfAttention.forward` as it was (`state`, which it did not have, is ignored; a plain scheme's
    layers have the full span, no temperature and no model options, which it did not have either)."""
    assert span is None or span.is_full, span
    assert temperature is None, temperature
    assert options is None or len(options) == 0, options  # type: ignore[arg-type]
    B, T, D = x.shape
    q, k, v = legacy_qkv_heads(attn, x, scheme, ctx, cache)
    y = attend(
        q,
        k,
        v,
        scheme,
        attn.layer,
        ctx,
        causal=causal,
        dropout_p=attn.dropout if attn.training else 0.0,
        chunk_size=attn.chunk_size,
        q_start=q.shape[2] - T,
    )  # (B, H, T, hd)
    y = y.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
    return attn.resid_drop(attn.proj(y))
