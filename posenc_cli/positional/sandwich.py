"""Sandwich: a parameter-free bias from the dot products of sinusoidal embeddings (Chi et al. 2023, "Dissecting
Transformer Length Extrapolation via the Lens of Receptive Field Analysis", §5).

bias_h(i, j) = (Σ_{k=1}^{d'/2} cos((i − j) / 10000^(2k/d')) − d'/2) / (h'·8/H),  h' = h + 1 = 1..H,

i.e. PE(i)·PE(j) − PE(i)·PE(i) for sinusoids of dimension d', scaled per head like ALiBi's slopes. Note k runs from 1,
as in NeMo's `SandwichRelativePositionEmbedding`. The bias is 0 at distance 0 and negative elsewhere; it depends on
|i − j| only, so one (N, H) table per forward (N = the span of positions) serves every layer and chunk.

d' defaults to the per-head size d_model / H: NeMo builds the module with `hidden_size // num_attention_heads`
(`kv_channels` when set) in `megatron/language_model.py`, which matches the paper's derivation from the dot product
of two attention heads' sinusoids. posenc before this default used d' = d_model, a penalty about 4.7× stronger at
distance 1000 for `model=tiny`; runs saved then keep it: their config.yaml holds `dim: null`, which a saved config
reads as d_model (`legacy_defaults`), while new runs record d' as a number (`resolve`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional import register
from posenc_cli.positional.base import PositionalScheme, PositionContext, ScoreMod, relative_distance
from posenc_cli.positional.t5 import distance_score_mod, distance_span, lookup_by_distance


@dataclass(kw_only=True)
class SandwichConfig(PosConfig):
    name: str = "sandwich"
    dim: int | None = None  # d'; None: the per-head size (recorded as a number in a run's config)
    base: float = 10000.0

    def resolve(self, model: ModelConfig, train_length: int) -> None:
        if self.dim is None:
            self.dim = sandwich_dim(self, model)

    def legacy_defaults(self, model: ModelConfig) -> None:
        if self.dim is None:  # saved before d' defaulted to the head size: it was d_model then
            self.dim = model.d_model

    def validate(self) -> None:
        if self.dim is not None and (self.dim < 2 or self.dim % 2):
            raise ConfigError(f"pos.dim must be even and >= 2, got {self.dim}")
        if self.base <= 1:
            raise ConfigError(f"pos.base must be > 1, got {self.base}")


def sandwich_dim(cfg: SandwichConfig, model: ModelConfig) -> int:
    """d': `pos.dim` when set, else the per-head size (NeMo's `hidden_size // num_attention_heads`)."""
    return cfg.dim if cfg.dim is not None else model.head_dim


def sandwich_profile(distances: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """distances (N,) -> (N,) fp32 Σ_{k=1}^{dim/2} cos(Δ / base^(2k/dim)) − dim/2."""
    k = torch.arange(1, dim // 2 + 1, dtype=torch.float64)
    freq = (base ** (-2.0 * k / dim)).to(torch.float32).to(distances.device)  # (dim/2,)
    angles = distances.to(torch.float32)[:, None] * freq[None, :]  # (N, dim/2)
    return angles.cos().sum(-1) - dim / 2


def sandwich_head_scales(n_head: int) -> Tensor:
    """(H,) fp32 divisors h'·8/H, h' = 1..H."""
    return torch.arange(1, n_head + 1, dtype=torch.float32) * 8.0 / n_head


def sandwich_table(distances: Tensor, dim: int, n_head: int, base: float = 10000.0) -> Tensor:
    """distances (N,) -> (N, H) fp32 bias per distance and head: profile / (h'·8/H)."""
    scales = sandwich_head_scales(n_head).to(distances.device)
    return sandwich_profile(distances, dim, base)[:, None] / scales[None, :]


@register
class Sandwich(PositionalScheme):
    name = "sandwich"
    config_cls = SandwichConfig
    hooks = ("bias",)
    paper = "Chi et al. 2023, arXiv:2212.10356"
    bias_shared_across_layers = True  # a function of positions only, the same in every layer
    relative = True  # |id_i − id_j| only

    def __init__(self, cfg: SandwichConfig, model: ModelConfig, train_length: int) -> None:
        super().__init__(cfg, model, train_length)
        self.dim = sandwich_dim(cfg, model)

    def prepare(self, ctx: PositionContext) -> None:
        ctx.tables["sandwich"] = sandwich_table(distance_span(ctx.positions), self.dim, self.n_head, self.cfg.base)

    def bias(
        self, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, ctx: PositionContext
    ) -> Tensor | None:
        dist = relative_distance(ctx.ids_at(q_pos), ctx.ids_at(k_pos)).abs()  # (..., Tq, Tk)
        return lookup_by_distance(ctx.tables["sandwich"], dist)

    def score_mod(self, layer: int, ctx: PositionContext) -> ScoreMod | None:
        return distance_score_mod(ctx.tables["sandwich"], ctx, causal=False)  # |i − j|
