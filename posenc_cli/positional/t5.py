"""T5 relative position bias: a learned scalar per (bucket, head), score_ij += b[bucket(j − i), h] (Raffel et al. 2020).

Bucketing follows HF `T5Attention._relative_position_bucket`: half the buckets hold exact distances 0..max_exact−1,
the other half cover max_exact..max_distance logarithmically; everything beyond max_distance shares the last bucket
(so the bias is constant far away and the scheme runs at any length). The model is causal, so buckets are causal
(n = max(i − j, 0)); the bidirectional variant is kept as a pure function for completeness and tests. Buckets
depend on n only, so they are computed once per forward for n = 0..T−1 and looked up by distance. With position
ids, n = max(id_i − id_j, 0) over the span of the ids (relative: a common shift of the ids changes nothing).

As in T5, one table serves every layer (T5 computes the bias in the first layer and passes it on). Initialisation
is HF's, N(0, d_model^−1/2). The bias is added to the scaled scores q·k/√d of SDPA, in logit units.
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


@dataclass(kw_only=True)
class T5Config(PosConfig):
    name: str = "t5"
    num_buckets: int = 32
    max_distance: int = 128

    def validate(self) -> None:
        if self.num_buckets < 2:
            raise ConfigError(f"pos.num_buckets must be >= 2, got {self.num_buckets}")
        if self.max_distance <= self.num_buckets // 2:
            raise ConfigError(
                f"pos.max_distance={self.max_distance} must exceed num_buckets/2={self.num_buckets // 2} "
                "(the exact buckets)"
            )


def relative_position_bucket(
    relative_position: Tensor, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """Bucket index (same shape, int64) of each relative position j − i (HF's sign convention: keys minus queries).

    Causal: n = max(i − j, 0); n < max_exact (= num_buckets/2) is its own bucket, larger n maps to
    max_exact + ⌊ln(n/max_exact) / ln(max_distance/max_exact) · (num_buckets − max_exact)⌋, capped at num_buckets − 1.
    Bidirectional: num_buckets is halved, keys after the query (j − i > 0) are offset by the halved count, n = |j − i|.
    """
    rel = relative_position.long()
    offset = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        offset = (rel > 0).long() * num_buckets
        n = rel.abs()
    else:
        n = (-rel).clamp(min=0)
    max_exact = num_buckets // 2
    # fp32 as in the reference, so bucket boundaries agree exactly; clamped below so log never sees 0
    ratio = n.clamp(min=max_exact).to(torch.float32) / max_exact
    log_bucket = max_exact + (torch.log(ratio) / math.log(max_distance / max_exact) * (num_buckets - max_exact)).long()
    log_bucket = log_bucket.clamp(max=num_buckets - 1)
    return offset + torch.where(n < max_exact, n, log_bucket)


def lookup_by_distance(table: Tensor, index: Tensor) -> Tensor:
    """table (N, H) per distance, index (Tq, Tk) distances -> (1, H, Tq, Tk) fp32 bias table[index, h]; index
    (B, Tq, Tk) -> (B, H, Tq, Tk).

    For biases that depend on i − j only: the (N, H) table is computed once per forward, and each layer and chunk
    pays one lookup instead of evaluating the formula on Tq·Tk entries (also used by kerple and sandwich)."""
    return batch_bias(nn.functional.embedding(index, table).float().movedim(-1, -3))  # (..., Tq, Tk, H) -> (., H, ..)


def distance_score_mod(table: Tensor, ctx: PositionContext, *, causal: bool) -> ScoreMod:
    """The `score_mod` of `lookup_by_distance`: score + table[n, h] for the id distance n = max(i − j, 0) (`causal`,
    T5's buckets) or |i − j| (kerple, sandwich); table (N, H) covers every distance of the forward (`distance_span`)."""
    table, ids = table.float(), id_lookup(ctx)  # (N, H)

    def by_distance(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        n = ids(b, q_idx) - ids(b, kv_idx)
        return score + table[n.clamp(min=0) if causal else n.abs(), h]

    return by_distance


def distance_span(positions: Tensor) -> Tensor:
    """(T,) or (B, T) position ids -> (N,) distances 0..max − min: every |i − j| a forward can ask for."""
    n = int(positions.max() - positions.min()) + 1 if positions.numel() else 1
    return torch.arange(n, device=positions.device)


@register
class T5Bias(PositionalScheme):
    name = "t5"
    config_cls = T5Config
    hooks = ("bias",)
    paper = "Raffel et al. 2020, arXiv:1910.10683 §2.1"
    bias_shared_across_layers = True  # a function of positions only, the same in every layer
    relative = True

    def __init__(self, cfg: T5Config, model: ModelConfig, train_length: int) -> None:
        super().__init__(cfg, model, train_length)
        self.num_buckets = cfg.num_buckets
        self.max_distance = cfg.max_distance
        self.relative_attention_bias = nn.Embedding(cfg.num_buckets, model.n_head)  # shared by all layers
        nn.init.normal_(self.relative_attention_bias.weight, mean=0.0, std=model.d_model**-0.5)

    def prepare(self, ctx: PositionContext) -> None:
        # bucket of each causal distance n = i − j, once per forward (the log runs on N values, not Tq·Tk)
        n = distance_span(ctx.positions)
        ctx.tables["t5_buckets"] = relative_position_bucket(-n, False, self.num_buckets, self.max_distance)  # (N,)

    def bias(
        self, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, ctx: PositionContext
    ) -> Tensor | None:
        per_distance = self.relative_attention_bias.weight[ctx.tables["t5_buckets"]]  # (N, H)
        dist = relative_distance(ctx.ids_at(q_pos), ctx.ids_at(k_pos)).clamp(min=0)  # (..., Tq, Tk); n < 0: bucket 0
        return lookup_by_distance(per_distance, dist)

    def score_mod(self, layer: int, ctx: PositionContext) -> ScoreMod | None:
        per_distance = self.relative_attention_bias.weight[ctx.tables["t5_buckets"]]  # (N, H)
        return distance_score_mod(per_distance, ctx, causal=True)
