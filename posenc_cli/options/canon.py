"""Canon layers (Allen-Zhu 2025, arXiv 2512.17351; facebookresearch/PhysicsLM4 `huggingface/canon_helper.py`).

Per channel c: h'_t = h_t + Σ_{m=0}^{K−1} w_c[K−1−m]·h_{t−m}, zeros before the first token: a causal depthwise
convolution of kernel K = 4, no bias, no activation, with the residual (`canon_helper.py:29-53,219-220`). Weights
(C, 1, K) as a depthwise `nn.Conv1d`'s, initialised as PyTorch's Conv1d does, U(−1/√K, 1/√K) (the reference keeps
that init, `modeling_llama_canon.py:708-709`). `model.canon` names the placements (`modeling_llama_canon.py`):

- A: the attention's input, after the block's first norm (width D);
- B: concat[q, k, v] after the QK-norm (if any), before the rotation (width 3D);
- C: the MLP's input, after the block's second norm (width D);
- D: the MLP's hidden layer before its activation (width mlp_ratio·D; the reference's gated MLP convolves
  concat[gate, up], posenc's GELU MLP has the one hidden layer).

Packed rows (`ctx.documents`): taps reaching before a token's document are zero, as at the row's start. The KV cache
keeps each placement's last K − 1 inputs (`KVCache.history`), so a decoding step convolves exactly as the full
forward does. No kernel is concerned.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc_cli.config import ModelConfig
from posenc_cli.kv_cache import KVCache
from posenc_cli.options import register
from posenc_cli.options.base import Heads, ModelOption
from posenc_cli.positional.base import PositionalScheme, PositionContext

KERNEL = 4


def causal_conv(h: Tensor, weight: Tensor, local: Tensor | None = None) -> Tensor:
    """h (B, T, C), weight (C, 1, K) -> (B, T, C): Σ_{m<K} weight[c, 0, K−1−m]·h_{t−m}, zero for t − m < 0 and, with
    `local` (B, T), each token's index within its document, for m > local_t (another document)."""
    T, K = h.shape[1], weight.shape[-1]
    w = weight[:, 0].to(h.dtype)  # (C, K)
    out = h * w[:, K - 1]
    for m in range(1, K):
        shifted = F.pad(h, (0, 0, m, 0))[:, :T]  # (B, T, C): h_{t−m}, zero before the first row
        if local is not None:
            shifted = shifted * (local >= m)[..., None].to(h.dtype)
        out = out + shifted * w[:, K - 1 - m]
    return out


class CanonConv(nn.Module):
    """One placement: the residual causal depthwise convolution over `width` channels."""

    def __init__(self, width: int, kernel: int = KERNEL) -> None:
        super().__init__()
        bound = kernel**-0.5  # nn.Conv1d's default for a depthwise kernel: U(−1/√K, 1/√K)
        self.weight = nn.Parameter(torch.empty(width, 1, kernel).uniform_(-bound, bound))  # (C, 1, K)

    def forward(self, h: Tensor, ctx: PositionContext, cache: KVCache | None, key: tuple[int, str]) -> Tensor:
        """h (B, T, C) of the new tokens -> h + conv(h), (B, T, C)."""
        T = h.shape[1]
        local = None if ctx.documents is None else ctx.documents.local[:, -T:]  # (B, T) the new tokens'
        if cache is None:
            return h + causal_conv(h, self.weight, local)
        K = self.weight.shape[-1]
        full = cache.history(key, h, K - 1)  # (B, K − 1 + T, C): the cached rows before the new ones
        if local is not None:  # the held rows' outputs are cut off: any index will do for them
            local = F.pad(local, (K - 1, 0))  # (B, K − 1 + T)
        return h + causal_conv(full, self.weight, local)[:, K - 1 :]


@register
class Canon(ModelOption):
    """`model.canon=ABCD` (any subset): this layer's Canon convolutions (`blocks.<i>.options.canon.convs.<p>.weight`,
    p in a, b, c, d)."""

    name = "canon"
    paper = "Canon layers (Allen-Zhu 2025, arXiv 2512.17351)"
    order = 10  # B after the QK-norm
    off = ""
    samples = ("ABCD", "AC", "B", "D")

    def __init__(self, cfg: ModelConfig, layer: int, scheme: PositionalScheme) -> None:
        super().__init__(cfg, layer, scheme)
        D = cfg.d_model
        widths = {"a": D, "b": 3 * D, "c": D, "d": cfg.mlp_ratio * D}
        self.convs = nn.ModuleDict({p: CanonConv(widths[p]) for p in str(cfg.canon).lower()})

    def _mix(self, placement: str, h: Tensor, ctx: PositionContext, cache: KVCache | None) -> Tensor:
        if placement not in self.convs:
            return h
        return self.convs[placement](h, ctx, cache, (self.layer, f"canon.{placement}"))

    def attention_input(self, x: Tensor, ctx: PositionContext, cache: KVCache | None) -> Tensor:
        return self._mix("a", x, ctx, cache)

    def heads(self, q: Tensor, k: Tensor, v: Tensor, ctx: PositionContext, cache: KVCache | None) -> Heads:
        if "b" not in self.convs:
            return q, k, v
        B, T, H, hd = q.shape
        qkv = self._mix("b", torch.cat([q, k, v], dim=2).reshape(B, T, 3 * H * hd), ctx, cache)  # (B, T, 3D)
        q, k, v = qkv.view(B, T, 3 * H, hd).split(H, dim=2)  # 3 × (B, T, H, hd)
        return q, k, v

    def mlp_input(self, x: Tensor, ctx: PositionContext, cache: KVCache | None) -> Tensor:
        return self._mix("c", x, ctx, cache)

    def mlp_hidden(self, h: Tensor, ctx: PositionContext, cache: KVCache | None) -> Tensor:
        return self._mix("d", h, ctx, cache)
