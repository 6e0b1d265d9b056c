"""Causal multi-head self-attention with the positional hooks, memory-bounded when a scheme adds a score bias.

Without a bias, attention is one fused `scaled_dot_product_attention` call with `is_causal=True`. With a bias, the
causal mask is folded into the bias (−inf where key position > query position) and, once the (B, H, T, T) bias would
exceed `BIAS_CHUNK_BYTES`, queries are processed in chunks: chunk c of queries [s, e) only sees keys [0, e), so no
full-length score or bias tensor ever exists. The Python loop runs over chunks of queries, never over tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc_cli.config import ModelConfig
from posenc_cli.positional.base import PositionalScheme, PositionContext

# Budget for one chunk's fp32 bias, (B, H, chunk, T) · 4 bytes. SDPA's math path allocates a few tensors of the same
# size (scores, softmax), so the transient peak is a small multiple of this.
BIAS_CHUNK_BYTES = 64 * 2**20


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
) -> Tensor:
    """softmax(q·kᵀ/√hd + bias + mask)·v for q, k, v (B, H, T, hd) -> (B, H, T, hd).

    `chunk_size` forces the number of queries per chunk on the bias path (None: from `BIAS_CHUNK_BYTES`).
    """
    if not scheme.has_bias:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
    B, H, T, _ = q.shape
    pos = ctx.positions
    chunk = chunk_size if chunk_size is not None else bias_chunk_size(B, H, T)
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


class CausalSelfAttention(nn.Module):
    """Fused QKV projection, scheme hooks on q/k, SDPA, output projection (`proj` is a residual projection)."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_head = cfg.n_head
        self.head_dim = cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_drop = nn.Dropout(cfg.dropout)
        self.chunk_size: int | None = None  # None: from BIAS_CHUNK_BYTES; tests force small chunks

    def qkv_heads(self, x: Tensor, scheme: PositionalScheme, ctx: PositionContext) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, D) -> q, k, v (B, H, T, hd), with q and k already rotated by the scheme."""
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)  # 3 × (B, T, D)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        q, k = scheme.rotate(q, k, ctx)
        return q, k, v

    def forward(self, x: Tensor, scheme: PositionalScheme, ctx: PositionContext, causal: bool = True) -> Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv_heads(x, scheme, ctx)
        y = attend(
            q,
            k,
            v,
            scheme,
            self.layer,
            ctx,
            causal=causal,
            dropout_p=self.dropout if self.training else 0.0,
            chunk_size=self.chunk_size,
        )  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return self.resid_drop(self.proj(y))
