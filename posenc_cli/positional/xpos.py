"""xPos: RoPE with an exponential decay per frequency pair (Sun et al. 2022, "A Length-Extrapolatable Transformer", §3).

Pair k of the rotary dims gets ζ_k = (2k/d + γ)/(1 + γ) (γ = 0.4, so ζ_k ∈ (0.29, 1)); the query at i is rotated
and multiplied by ζ_k^(i/s), the key at j rotated and multiplied by ζ_k^(−j/s), s = scale base (512). Pair k of
q_i·k_j is then the RoPE term times ζ_k^((i−j)/s): a decay with distance for i > j, hence causal only (with
`causal=False` the scores of future keys would grow instead).

Numerics. ζ^(±p/s) over- or underflows at long lengths (ζ_0^(−16384/512) ≈ 2·10^17 and growing exponentially).
Only i − j matters, so positions are shifted by a common centre c (the middle of the sequence, as torchscale does):
q gets ζ^((i−c)/s), k gets ζ^(−(j−c)/s), with exponents at most |T/2|/s·ln(1/ζ_0) ≈ 1.25·T/(2s) in size (fp32 is
safe to T ≈ 70k; the product is exact). Scales are computed in fp32 as exp(((p − c)/s)·ln ζ) and folded into RoPE's
cos/sin tables, so `apply_rope` does rotation and scaling in one fp32 pass.

Position ids: i and j are the ids and c is the midpoint of each row's ids (relative: a common shift of the ids moves
c with them and changes nothing but RoPE's rounding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional import register
from posenc_cli.positional.base import PositionalScheme, PositionContext, per_head
from posenc_cli.positional.rope import Layout, apply_rope, rope_cos_sin, rope_inv_freq


@dataclass(kw_only=True)
class XposConfig(PosConfig):
    name: str = "xpos"
    gamma: float = 0.4
    scale_base: float = 512.0
    base: float = 10000.0
    layout: Layout = "rotate_half"

    def validate(self) -> None:
        if self.gamma <= 0:
            raise ConfigError(f"pos.gamma must be > 0, got {self.gamma}")
        if self.scale_base <= 0:
            raise ConfigError(f"pos.scale_base must be > 0, got {self.scale_base}")
        if self.base <= 1:
            raise ConfigError(f"pos.base must be > 1, got {self.base}")


def xpos_zeta(dim: int, gamma: float = 0.4) -> Tensor:
    """(dim/2,) fp32 decay bases ζ_k = (2k/dim + γ)/(1 + γ), k = 0..dim/2−1."""
    k = torch.arange(0, dim, 2, dtype=torch.float64)  # 2k
    return ((k / dim + gamma) / (1.0 + gamma)).to(torch.float32)


def xpos_scale(positions: Tensor, zeta: Tensor, scale_base: float, center: Tensor | float, layout: Layout) -> Tensor:
    """positions (T,) or (B, T) -> (T, d) or (B, T, d) fp32 factors ζ_k^((p − center)/s), laid out like RoPE's cos/sin
    for `layout`; center: a number, 0-d, or (B, 1) per row."""
    power = (positions.to(torch.float32) - center) / scale_base  # (..., T)
    log_scale = power[..., None] * zeta.to(positions.device).log()  # (..., T, d/2)
    paired = torch.cat([log_scale, log_scale], -1) if layout == "rotate_half" else log_scale.repeat_interleave(2, -1)
    return paired.exp()  # (T, d)


def sequence_center(positions: Tensor) -> Tensor:
    """Midpoint of the positions of a forward (a 0-d fp32 tensor, no host sync); (B, T) ids: (B, 1), one per row."""
    p = positions.to(torch.float32)
    if p.dim() == 2:
        return (p.amin(-1, keepdim=True) + p.amax(-1, keepdim=True)) / 2
    return (p.min() + p.max()) / 2


@register
class XPos(PositionalScheme):
    name = "xpos"
    config_cls = XposConfig
    hooks = ("rotate",)
    paper = "Sun et al. 2022, arXiv:2212.10554"
    relative = True

    def __init__(self, cfg: XposConfig, model: ModelConfig, train_length: int) -> None:
        super().__init__(cfg, model, train_length)
        self.layout: Layout = cfg.layout

    def prepare(self, ctx: PositionContext) -> None:
        cfg = self.cfg
        # recomputed per forward (d/2 floats): never rounded by `model.to(bfloat16)`
        cos, sin = rope_cos_sin(ctx.positions, rope_inv_freq(self.head_dim, cfg.base), self.layout)  # (T, hd)
        zeta = xpos_zeta(self.head_dim, cfg.gamma)
        scale = xpos_scale(ctx.positions, zeta, cfg.scale_base, sequence_center(ctx.positions), self.layout)  # (T, hd)
        ctx.tables["xpos_q"] = (per_head(cos * scale), per_head(sin * scale))  # (T, hd) or (B, 1, T, hd)
        ctx.tables["xpos_k"] = (per_head(cos / scale), per_head(sin / scale))

    def rotate(self, q: Tensor, k: Tensor, ctx: PositionContext) -> tuple[Tensor, Tensor]:
        (cq, sq), (ck, sk) = ctx.tables["xpos_q"], ctx.tables["xpos_k"]
        return apply_rope(q, cq, sq, self.layout), apply_rope(k, ck, sk, self.layout)

    def rotate_rows(self, q: Tensor, k: Tensor, ctx: PositionContext, q_start: int) -> tuple[Tensor, Tensor]:
        (cq, sq), (ck, sk) = ctx.tables["xpos_q"], ctx.tables["xpos_k"]  # (T, hd) or (B, 1, T, hd)
        cq, sq = cq[..., q_start:, :], sq[..., q_start:, :]  # the query rows' positions
        return apply_rope(q, cq, sq, self.layout), apply_rope(k, ck, sk, self.layout)
