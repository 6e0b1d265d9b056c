"""QK-norm: q and k normalised per head before their dot product.

- `rms` (Qwen3, transformers `models/qwen3/modeling_qwen3.py:229-230,245-250`): RMSNorm over each head's hd channels
  with a weight w (init 1) shared by the heads, one for q and one for k, before the rotation: w ⊙ x/√(mean x² + ε).
- `l2` (Llama 4's `L2Norm`, `models/llama4/modeling_llama4.py:106-122,353-360`): the same without a weight, after the
  rotation (a weightless norm of a whole head commutes with a rotation; with xPos's scaling it does not).

ε = 1e-6 (Qwen3's rms_norm_eps; Llama 4's is 1e-5). ‖x̂‖ = √hd, so with the 1/√hd scale a logit is √hd·cos(q, k),
whatever a temperature later multiplies q by (the norm runs before `model.attn_scale` and a layout's temperature).
`model.qk_norm_layers=rotary`: only the layers whose scheme rotates q and k (a layout's RoPE layers, as Llama 4);
the others get no norm and no weight. No kernel is concerned.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc_cli.config import ModelConfig
from posenc_cli.kv_cache import KVCache
from posenc_cli.options import register
from posenc_cli.options.base import Heads, ModelOption
from posenc_cli.positional.base import PositionalScheme, PositionContext

EPS = 1e-6


def rms_normalised(x: Tensor, eps: float = EPS) -> Tensor:
    """x (..., hd) / √(mean over hd of x² + eps), computed in fp32, returned in x's dtype."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@register
class QKNorm(ModelOption):
    """`model.qk_norm=rms|l2`: this layer's q and k norms (rms: `blocks.<i>.options.qk_norm.q_weight`, `k_weight`)."""

    name = "qk_norm"
    paper = "QK-norm (Qwen3 RMSNorm per head; Llama 4 weightless L2Norm)"
    order = 0
    samples = ("rms", "l2")

    def __init__(self, cfg: ModelConfig, layer: int, scheme: PositionalScheme) -> None:
        super().__init__(cfg, layer, scheme)
        on = cfg.qk_norm_layers == "all" or "rotate" in scheme.hooks
        self.kind = cfg.qk_norm if on else "none"
        if self.kind == "rms":
            self.q_weight = nn.Parameter(torch.ones(cfg.head_dim))
            self.k_weight = nn.Parameter(torch.ones(cfg.head_dim))

    def heads(self, q: Tensor, k: Tensor, v: Tensor, ctx: PositionContext, cache: KVCache | None) -> Heads:
        if self.kind != "rms":
            return q, k, v
        return rms_normalised(q) * self.q_weight.to(q.dtype), rms_normalised(k) * self.k_weight.to(k.dtype), v

    def rotated(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        if self.kind != "l2":
            return q, k
        return rms_normalised(q), rms_normalised(k)
