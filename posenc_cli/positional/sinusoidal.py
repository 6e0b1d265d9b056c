"""Fixed sinusoidal absolute positions added to the token embeddings (Vaswani et al. 2017, §3.5).

Two layouts of the same frequencies family:
- `vaswani`: PE(p, 2k) = sin(p·ω_k), PE(p, 2k+1) = cos(p·ω_k), ω_k = 10000^(−2k/D) (interleaved);
- `t2t` (tensor2tensor / fairseq, the ALiBi paper's baseline): ω_k = exp(−k·ln 10000 / (D/2 − 1)), [sin ‖ cos].

Scale. Vaswani and fairseq multiply token embeddings (init std D^−1/2) by √D, so tokens have unit scale and PE
(per-dimension RMS 1/√2) is of comparable size. Our token embeddings are GPT-style, N(0, init_std²) and tied to the
output layer, and are not rescaled. To keep the same token:position ratio at initialisation we add `scale · PE` with
`scale = init_std` by default: the embedding sum is then exactly fairseq's divided by the constant 1/init_std.
Set `pos.scale=1.0` for the unscaled sum. Under `model.embedding=fairseq` (tokens × √D) the default is 1, fairseq's.
With position ids, PE(id) is added.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional import register
from posenc_cli.positional.base import PositionalScheme, PositionContext

Variant = Literal["vaswani", "t2t"]


@dataclass(kw_only=True)
class SinusoidalConfig(PosConfig):
    name: str = "sinusoidal"
    variant: Variant = "vaswani"
    base: float = 10000.0
    scale: float | None = None  # None: the recipe's (model.sinusoid_scale: init_std for gpt2, 1 for fairseq)

    def validate(self) -> None:
        if self.base <= 1:
            raise ConfigError(f"pos.base must be > 1, got {self.base}")
        if self.scale is not None and self.scale <= 0:
            raise ConfigError(f"pos.scale must be > 0, got {self.scale}")


def sinusoid_frequencies(dim: int, variant: Variant = "vaswani", base: float = 10000.0) -> Tensor:
    """(dim/2,) fp32 angular frequencies ω_k of the chosen variant."""
    half = dim // 2
    k = torch.arange(half, dtype=torch.float64)
    vaswani = base ** (-2.0 * k / dim)  # base^(−2k/D)
    return (vaswani if variant == "vaswani" else torch.exp(-k * math.log(base) / (half - 1))).to(torch.float32)


def sinusoid_table(positions: Tensor, dim: int, variant: Variant = "vaswani", base: float = 10000.0) -> Tensor:
    """positions (T,) or (B, T) -> (T, dim) or (B, T, dim) fp32 table PE(p) in the variant's layout (interleaved or
    [sin ‖ cos])."""
    freq = sinusoid_frequencies(dim, variant, base).to(positions.device)
    angles = positions.to(torch.float32)[..., None] * freq  # (..., T, dim/2)
    if variant == "vaswani":
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # (T, dim): sin, cos, sin, cos, ...
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (T, dim): sin ... sin, cos ... cos


@register
class Sinusoidal(PositionalScheme):
    name = "sinusoidal"
    config_cls = SinusoidalConfig
    hooks = ("embed",)
    paper = "Vaswani et al. 2017, arXiv:1706.03762 §3.5"

    def __init__(self, cfg: SinusoidalConfig, model: ModelConfig, train_length: int) -> None:
        super().__init__(cfg, model, train_length)
        if cfg.variant == "t2t" and model.d_model < 4:
            raise ConfigError("pos.variant=t2t needs model.d_model >= 4")
        self.variant: Variant = cfg.variant
        self.base = cfg.base
        self.scale = cfg.scale if cfg.scale is not None else model.sinusoid_scale

    def prepare(self, ctx: PositionContext) -> None:
        ctx.tables["sinusoid"] = self.scale * sinusoid_table(ctx.positions, self.d_model, self.variant, self.base)

    def embed(self, x: Tensor, ctx: PositionContext) -> Tensor:
        return x + ctx.tables["sinusoid"].to(x.dtype)  # (B, T, D) + (T, D) or (B, T, D)
