"""FIRE: a learned MLP of the normalised log distance as score bias (Li et al. 2023, "Functional Interpolation for
Relative Positions", Eq. 4-6).

b_h(i, j) = f_θ(ψ(i − j) / ψ(max(L, i)))_h,  ψ(x) = log(c·x + 1),  f_θ: 1 → 32 → H MLP with ReLU,
c learned (init 0.1), threshold L = |L_mult·L0| with L_mult learned (init 1).

L0 defaults to a quarter of the training length. This is a documented deviation: the paper's listing (its
appendix) defaults to the absolute `init_L = 512.`, and the paper does not state L0 as a fraction of the training
length; L_train/4 is posenc's inference from that default and the 2048-token C4 models it served (512 = 2048/4).
Queries past a quarter of the training window are then normalised by their own position during training, so the
MLP learns the progressive regime it meets beyond L_train. `pos.init_L=512` gives the listing's value. posenc
earlier used the absolute 512 at every training length; at `train.seq_len=128` max(L, i) was then the constant 512
throughout training. Runs saved then keep `init_L: 512.0` in their config.yaml
(the field was always written), and new runs record the resolved L0 as a number (`resolve`).

The normaliser uses max(L, i), not min: below the threshold the input is ψ(i − j)/ψ(L) (no interpolation for short
contexts), beyond it the distances are squeezed into [0, 1] relative to the query's own position ("progressive
interpolation"). As in the paper's code, ψ is applied to |c·x| (so a c that turns negative in training keeps ψ
defined) and ε = 1e-6 is added to the normaliser.

Layer sharing: by default every layer has its own FIRE (the paper's main setting; `pos.shared=true` gives the
paper's FIRE-S variant, one FIRE for all layers).

Position ids: i and j are the ids. FIRE is not relative in the sense of `PositionalScheme.relative`: the normaliser
ψ(max(L, i)) reads the query's own id, so a common shift of the ids changes the bias.

Evaluation. With a scalar input the MLP is piecewise linear in u (one breakpoint per hidden unit), so it is evaluated
exactly as slope_s·u + intercept_s on the segment s that holds u (`relu_mlp_piecewise`): no (Tq, Tk, width) hidden
tensor, which would be width/(B·H) times the bias chunk the attention path budgets for, and ~2.5× faster on CPU.
Values equal the MLP's up to rounding, and so do the gradients of every parameter (relu'(0) aside, which only
matters if a unit's breakpoint falls exactly on an input).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional import register
from posenc_cli.positional.base import (
    PositionalScheme,
    PositionContext,
    ScoreMod,
    batch_bias,
    id_lookup,
    relative_distance,
)

EPS = 1e-6  # added to the normaliser ψ(max(L, i)) (paper's code)
THRESHOLD_FRACTION = 0.25  # L0 / training length: the paper's code default 512 at its training length 2048
LEGACY_INIT_L = 512.0  # L0 before it followed the training length


@dataclass(kw_only=True)
class FireConfig(PosConfig):
    name: str = "fire"
    mlp_width: int = 32
    init_c: float = 0.1
    init_L: float | None = None  # L0 (threshold |L_mult·L0|); None: THRESHOLD_FRACTION × the training length
    shared: bool = False  # True: FIRE-S, one FIRE for all layers

    def resolve(self, model: ModelConfig, train_length: int) -> None:
        if self.init_L is None:
            self.init_L = fire_init_L(self, train_length)

    def legacy_defaults(self, model: ModelConfig) -> None:
        if self.init_L is None:  # never written by posenc before the change; kept for hand-written configs
            self.init_L = LEGACY_INIT_L

    def validate(self) -> None:
        if self.mlp_width < 1:
            raise ConfigError(f"pos.mlp_width must be >= 1, got {self.mlp_width}")
        if self.init_c <= 0:
            raise ConfigError(f"pos.init_c must be > 0, got {self.init_c}")
        if self.init_L is not None and self.init_L <= 0:
            raise ConfigError(f"pos.init_L must be > 0, got {self.init_L}")


def fire_init_L(cfg: FireConfig, train_length: int) -> float:
    """L0: `pos.init_L` when set, else THRESHOLD_FRACTION × `train_length` (at least 1)."""
    return float(cfg.init_L) if cfg.init_L is not None else max(1.0, THRESHOLD_FRACTION * train_length)


def fire_psi(x: Tensor, c: Tensor) -> Tensor:
    """ψ(x) = log(|c·x| + 1), elementwise."""
    return torch.log1p((c * x).abs())


def fire_input(q_pos: Tensor, k_pos: Tensor, c: Tensor, threshold: Tensor) -> Tensor:
    """ids (..., Tq), (..., Tk) -> (..., Tq, Tk) fp32 MLP input ψ(i − j) / (ψ(max(L, i)) + ε)."""
    c = c.float()
    dist = relative_distance(q_pos, k_pos).to(torch.float32)  # (..., Tq, Tk)
    normaliser = torch.maximum(q_pos.to(torch.float32), threshold.float())  # (..., Tq) max(L, i)
    return fire_psi(dist, c) / (fire_psi(normaliser, c) + EPS)[..., :, None]


def relu_mlp_piecewise(u: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    """W2·relu(w1·u + b1) + b2 for scalar inputs u (...) -> (..., H), without the (..., M) hidden layer.

    w1, b1 (M,) first layer (1 → M), w2 (H, M), b2 (H,) second layer. Unit m switches at t_m = −b1_m/w1_m. On the
    segment holding s breakpoints ≤ u, unit m is active iff (w1_m > 0 and its rank among the sorted breakpoints is
    < s) or (w1_m < 0 and rank ≥ s) or (w1_m = 0 and b1_m > 0); the output there is linear in u.
    """
    with torch.autocast(u.device.type, enabled=False):
        w1, b1, w2, b2 = w1.float(), b1.float(), w2.float(), b2.float()
        m = w1.shape[0]
        moving = w1 != 0
        t = torch.where(moving, -b1 / torch.where(moving, w1, torch.ones_like(w1)), torch.full_like(w1, math.inf))
        t_sorted, order = t.detach().sort()  # (M,), units that never switch (w1 = 0) last
        rank = torch.empty_like(order)
        rank[order] = torch.arange(m, device=order.device)
        s = torch.arange(m + 1, device=w1.device)[:, None]  # (M+1, 1) segment index
        rising = (w1 > 0)[None] & (rank[None] < s)
        falling = (w1 < 0)[None] & (rank[None] >= s)
        constant = (~moving & (b1 > 0))[None]
        active = (rising | falling | constant).float()  # (M+1, M)
        table = torch.cat([(active * w1) @ w2.T, (active * b1) @ w2.T + b2], dim=-1)  # (M+1, 2H): slope, intercept
        seg = torch.searchsorted(t_sorted, u.detach().float().contiguous(), right=True)  # (...) breakpoints ≤ u
        coef = nn.functional.embedding(seg, table)  # (..., 2H)
        slope, intercept = coef.chunk(2, dim=-1)
        return torch.addcmul(intercept, slope, u.float()[..., None])  # (..., H)


class Fire(nn.Module):
    """One FIRE: the MLP f_θ and the scalars c and L_mult."""

    def __init__(self, n_head: int, width: int, init_c: float, init_L: float) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, n_head))
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.L_mult = nn.Parameter(torch.tensor(1.0))
        self.init_L = init_L

    def threshold(self) -> Tensor:
        """L = |L_mult·L0|."""
        return (self.L_mult.float() * self.init_L).abs()

    def forward(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """ids (Tq,), (Tk,) -> (1, H, Tq, Tk) fp32 bias; (B, Tq), (B, Tk) -> (B, H, Tq, Tk)."""
        u = fire_input(q_pos, k_pos, self.c, self.threshold())  # (..., Tq, Tk)
        lin1, lin2 = self.mlp[0], self.mlp[2]
        out = relu_mlp_piecewise(u, lin1.weight[:, 0], lin1.bias, lin2.weight, lin2.bias)  # (..., Tq, Tk, H) = mlp(u)
        return batch_bias(out.movedim(-1, -3))  # (1 or B, H, Tq, Tk)

    def score_mod(self, ctx: PositionContext) -> ScoreMod:
        """`forward` as FlexAttention's score_mod: u = ψ(i − j) / (ψ(max(L, i)) + ε) per score, then the MLP unit by
        unit (M scalar terms w2[h, m]·relu(w1_m·u + b1_m); the piecewise table needs a search per score)."""
        lin1, lin2 = self.mlp[0], self.mlp[2]
        c, threshold, ids = self.c.float(), self.threshold(), id_lookup(ctx)
        w1, b1, w2, b2 = lin1.weight[:, 0].float(), lin1.bias.float(), lin2.weight.float(), lin2.bias.float()
        width = w1.shape[0]

        def fire(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            i, j = ids(b, q_idx).to(torch.float32), ids(b, kv_idx).to(torch.float32)
            u = fire_psi(i - j, c) / (fire_psi(torch.maximum(i, threshold), c) + EPS)
            out = score + b2[h]
            for m in range(width):  # unrolled at trace time: M elementwise terms
                out = out + w2[h, m] * torch.relu(w1[m] * u + b1[m])
            return out

        return fire


@register
class FIRE(PositionalScheme):
    name = "fire"
    config_cls = FireConfig
    hooks = ("bias",)
    paper = "Li et al. 2023, arXiv:2310.04418"

    def __init__(self, cfg: FireConfig, model: ModelConfig, train_length: int) -> None:
        super().__init__(cfg, model, train_length)
        n = 1 if cfg.shared else model.n_layer
        init_L = fire_init_L(cfg, train_length)
        self.fires = nn.ModuleList(Fire(model.n_head, cfg.mlp_width, cfg.init_c, init_L) for _ in range(n))

    def bias(
        self, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, ctx: PositionContext
    ) -> Tensor | None:
        return self.fires[0 if len(self.fires) == 1 else layer](ctx.ids_at(q_pos), ctx.ids_at(k_pos))

    def score_mod(self, layer: int, ctx: PositionContext) -> ScoreMod | None:
        return self.fires[0 if len(self.fires) == 1 else layer].score_mod(ctx)
