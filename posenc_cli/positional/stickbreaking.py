"""Stick-breaking attention: each query breaks a stick from its nearest key backwards (Tan et al., ICLR 2025,
arXiv 2410.17980, Eq. 2-4). No other position signal: order comes from the breaking alone.

β_ij = σ(z_ij), z_ij = q_i·k_j/√d, and A_ij = β_ij Π_{j<k<i} (1 − β_ik) for j < i: key j takes the share β_ij of
what the keys between it and the query left. In log space, log A_ij = log σ(z_ij) + Σ_{j<k<i} log σ(−z_ik); the sum
is a reverse cumulative sum over keys, accumulated from the query outwards, so the near keys that carry the weight
are summed first and keep their digits. The weights need not sum to 1: as in the reference, the remainder
1 − Σ_j A_ij goes to the query's own value (shawntan/stickbreaking-attention `tests/test_attn.py` `ref_fwd`:
`o = o + rem[..., None] * v`, with `stickbreaking_attention/sb_ref.py` computing A and rem). The reference's
`attend_current` (default False there) lets the query's own key take part in the breaking: `pos.attend_current`.
`pos.logit_bias` (posenc's, 0 by default) adds a constant to every logit first.

This is the scheme that owns the normaliser (`normalise` hook, run by `posenc_cli.attention.scored.Scored`): the
logits are posenc's usual q·kᵀ/√d, the softmax is replaced. A layer's span (a layout's sliding window or chunks)
hides keys from the breaking entirely: a hidden key neither takes a share nor shrinks the stick.

Position ids: ignored (the breaking follows token order, as causality does), so trivially `relative`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc_cli.config import PosConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional import register
from posenc_cli.positional.base import PositionalScheme, PositionContext


@dataclass(kw_only=True)
class StickBreakingConfig(PosConfig):
    name: str = "stickbreaking"
    attend_current: bool = False  # the query's own key joins the breaking (the reference's `attend_current`)
    # A constant added to every logit before the breaking, β_ij = σ(z_ij + b) (0: the reference). A negative b starts
    # each key's share small, so the stick reaches further back: posenc's option, to test whether the local start
    # (every β near 1/2 at initialisation) decides what the scheme learns.
    logit_bias: float = 0.0

    def validate(self) -> None:
        if not math.isfinite(self.logit_bias):
            raise ConfigError(f"pos.logit_bias must be a finite number, got {self.logit_bias}")


def stick_breaking_weights(
    logits: Tensor, q_pos: Tensor, k_pos: Tensor, visible: Tensor, attend_current: bool = False
) -> Tensor:
    """logits (B, H, Tq, Tk) fp32, q_pos (Tq,), k_pos (Tk,) token indexes, visible (Tq, Tk) bool -> weights
    (B, H, Tq, Tk): A_ij for the broken keys, plus the remainder 1 − Σ_j A_ij on the query's own key (if visible)."""
    own = k_pos[None, :] == q_pos[:, None]  # (Tq, Tk)
    broken = visible & (k_pos[None, :] <= q_pos[:, None] if attend_current else k_pos[None, :] < q_pos[:, None])
    log_beta = F.logsigmoid(logits).masked_fill(~broken, float("-inf"))  # log β_ij
    log_rest = F.logsigmoid(-logits).masked_fill(~broken, 0.0)  # log(1 − β_ik)
    after = log_rest.flip(-1).cumsum(-1).flip(-1) - log_rest  # Σ_{k > j} log(1 − β_ik) over the broken keys
    weights = torch.exp(log_beta + after)  # (B, H, Tq, Tk), 0 where not broken
    remainder = 1.0 - weights.sum(-1, keepdim=True)  # (B, H, Tq, 1)
    return weights + remainder * (own & visible)


@register
class StickBreaking(PositionalScheme):
    name = "stickbreaking"
    config_cls = StickBreakingConfig
    hooks = ("normalise",)
    paper = "Tan et al. 2025, arXiv:2410.17980"
    relative = True  # ignores the ids
    causal_only = True  # a key's share is what the keys between it and the query left

    def normalise(
        self, layer: int, logits: Tensor, q_pos: Tensor, k_pos: Tensor, visible: Tensor, ctx: PositionContext
    ) -> Tensor:
        if self.cfg.logit_bias:
            logits = logits + self.cfg.logit_bias
        return stick_breaking_weights(logits, q_pos, k_pos, visible, self.cfg.attend_current)
