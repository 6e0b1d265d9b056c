"""KERPLE: a learned conditionally positive definite kernel of the distance as score bias (Chi et al. 2022, §4).

- `log`:   score_ij += −p_h·log(1 + a_h·|i − j|)
- `power`: score_ij += −a_h·|i − j|^(p_h), 0 < p_h ≤ 2

p_h, a_h > 0 are learned per head. As in the reference code (chijames/KERPLE, `ParallelKerpleLog`/`...Power`):
initialisation p ~ U(0, 2), a ~ U(0, 1); one set of parameters shared by every layer (the reference builds one
module and hands it to all layers); positivity by clamping at 0.01 (p also at 2 for `power`). The reference clamps
the stored parameters in place before each use; here the clamp is applied in the forward (same values; a parameter
pushed below 0.01 gets no gradient until the optimiser's momentum moves it back, where the reference would restart
it from 0.01). With position ids the distance is |id_i − id_j| (relative: a common shift changes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.positional import register
from posenc_cli.positional.base import PositionalScheme, PositionContext, ScoreMod, relative_distance
from posenc_cli.positional.t5 import distance_score_mod, distance_span, lookup_by_distance

Variant = Literal["log", "power"]
EPS = 0.01  # lower bound of p and a (reference: 1e-2)
P_MAX = 2.0  # upper bound of p for the power kernel (conditional positive definiteness needs p ≤ 2)


@dataclass(kw_only=True)
class KerpleConfig(PosConfig):
    name: str = "kerple"
    variant: Variant = "log"


def kerple_params(p: Tensor, a: Tensor, variant: Variant) -> tuple[Tensor, Tensor]:
    """Raw (H,) parameters -> the fp32 values used: p, a ≥ 0.01, and p ≤ 2 for `power`."""
    p_max = P_MAX if variant == "power" else None
    return p.float().clamp(min=EPS, max=p_max), a.float().clamp(min=EPS)


def kerple_kernel(variant: Variant, p: Tensor, a: Tensor, distances: Tensor) -> Tensor:
    """p, a (H,) (already clamped), distances (N,) |i − j| -> (N, H) fp32 bias per distance and head."""
    dist = distances.to(torch.float32)[:, None]  # (N, 1)
    p, a = p[None, :], a[None, :]  # (1, H)
    return -p * torch.log1p(a * dist) if variant == "log" else -a * dist.pow(p)


@register
class Kerple(PositionalScheme):
    name = "kerple"
    config_cls = KerpleConfig
    hooks = ("bias",)
    paper = "Chi et al. 2022, arXiv:2205.09921"
    bias_shared_across_layers = True  # a function of positions only, the same in every layer
    relative = True

    def __init__(self, cfg: KerpleConfig, model: ModelConfig, train_length: int) -> None:
        super().__init__(cfg, model, train_length)
        self.variant: Variant = cfg.variant
        self.p = nn.Parameter(torch.rand(model.n_head) * 2.0)  # (H,) U(0, 2)
        self.a = nn.Parameter(torch.rand(model.n_head))  # (H,) U(0, 1)

    def prepare(self, ctx: PositionContext) -> None:
        p, a = kerple_params(self.p, self.a, self.variant)
        # the kernel depends on |i − j| only: one (N, H) table per forward, shared by all layers and chunks
        ctx.tables["kerple"] = kerple_kernel(self.variant, p, a, distance_span(ctx.positions))

    def bias(
        self, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, ctx: PositionContext
    ) -> Tensor | None:
        dist = relative_distance(ctx.ids_at(q_pos), ctx.ids_at(k_pos)).abs()  # (..., Tq, Tk)
        return lookup_by_distance(ctx.tables["kerple"], dist)

    def score_mod(self, layer: int, ctx: PositionContext) -> ScoreMod | None:
        return distance_score_mod(ctx.tables["kerple"], ctx, causal=False)  # |i − j|
