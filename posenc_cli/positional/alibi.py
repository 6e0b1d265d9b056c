"""ALiBi: a per-head linear penalty on attention scores, score_ij += −m_h·(i − j) (Press et al. 2022, §3).

Slopes are fairseq's `get_slopes` (the paper's reference code), including its rule for head counts that are not
powers of two. The bias is a pure function of i − j and the head, so nothing is learned or stored in checkpoints.
For causal attention −m_h·(i − j) = m_h·j − m_h·i, and the per-query term −m_h·i leaves every softmax row unchanged
(fairseq adds m_h·j to its causal mask for the same reason): `key_bias` offers m_h·j, which lets attention use the
fused causal kernel without building an (H, T, T) bias. With position ids, i and j are the ids (relative: a
common shift of the ids changes nothing), and m_h·j stays a key-only bias, per row for (B, T) ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc_cli.config import PosConfig
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
class AlibiConfig(PosConfig):
    name: str = "alibi"


def _power_of_two_slopes(n: int) -> list[float]:
    """Geometric sequence start^(h+1), start = 2^(−8/n), h = 0..n−1."""
    return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]


def alibi_slopes(n_head: int) -> Tensor:
    """(n_head,) fp32 slopes m_h. Non-powers of two: slopes(c) then every other slope of slopes(2c), c = 2^⌊log2 H⌋."""
    if n_head < 1:
        raise ValueError(f"n_head must be >= 1, got {n_head}")
    c = 2 ** math.floor(math.log2(n_head))
    slopes = _power_of_two_slopes(c)
    if c < n_head:
        slopes += _power_of_two_slopes(2 * c)[0::2][: n_head - c]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """slopes (H,), ids q_pos (Tq,), k_pos (Tk,) -> (1, H, Tq, Tk) fp32 bias −m_h·(i − j); (B, Tq), (B, Tk) ->
    (B, H, Tq, Tk)."""
    dist = relative_distance(q_pos, k_pos).to(torch.float32)  # (..., Tq, Tk)
    return batch_bias(-slopes[:, None, None] * dist.unsqueeze(-3))  # (1 or B, H, Tq, Tk)


def alibi_key_bias(slopes: Tensor, k_pos: Tensor) -> Tensor:
    """slopes (H,), ids k_pos (Tk,) -> (H, Tk) fp32 m_h·j: the ALiBi bias up to the per-query constant −m_h·i;
    (B, Tk) -> (B, H, Tk)."""
    return slopes[:, None] * k_pos.to(torch.float32).unsqueeze(-2)


@register
class ALiBi(PositionalScheme):
    name = "alibi"
    config_cls = AlibiConfig
    hooks = ("bias",)
    paper = "Press et al. 2022, arXiv:2108.12409"
    bias_shared_across_layers = True
    relative = True

    def prepare(self, ctx: PositionContext) -> None:
        # Built per forward (H floats) rather than kept as a buffer, so `model.to(bfloat16)` cannot round the slopes.
        ctx.tables["alibi_slopes"] = alibi_slopes(self.n_head).to(ctx.positions.device)

    def bias(
        self, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, ctx: PositionContext
    ) -> Tensor | None:
        return alibi_bias(ctx.tables["alibi_slopes"], ctx.ids_at(q_pos), ctx.ids_at(k_pos))

    def key_bias(self, k_pos: Tensor, ctx: PositionContext) -> Tensor | None:
        return alibi_key_bias(ctx.tables["alibi_slopes"], ctx.ids_at(k_pos))

    def score_mod(self, layer: int, ctx: PositionContext) -> ScoreMod | None:
        slopes, ids = ctx.tables["alibi_slopes"], id_lookup(ctx)  # (H,)

        def alibi(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score - slopes[h] * (ids(b, q_idx) - ids(b, kv_idx)).to(torch.float32)

        return alibi
