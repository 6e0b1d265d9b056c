"""CoPE: contextual positions counted by gates (Golovneva et al. 2024, "Contextual Position Encoding", Eq. 3-5).

g_ij = σ(q_i·k_j/√d) for j ≤ i (0 for future keys), p_ij = Σ_{t=j}^{i} g_it (a reverse cumulative sum over keys,
clamped to max_pos − 1), and logits_ij += q_i·e[p_ij], with e ∈ R^(max_pos×d) learned and a fractional p
interpolated between e[⌊p⌋] and e[⌈p⌉] (computed as the interpolation of the integer logits q_i·e[n], Eq. 5).

Units, as in the paper's code (and x-transformers' `CoPE`): the gates use the scaled, masked scores q·k/√d, and
the positional term q·e[p] is added after scaling, unscaled. SDPA scales q·k but not the bias, so the bias returned
here is exactly q·e[p]. e is zero-initialised, shared by the heads of a layer, one per layer (the paper's code
holds one CoPE per attention layer). The bias depends on content, so it is computed from the hook's q and k in
every layer; under the chunked attention path a chunk of queries sees keys [0, end), and since gates of future keys
are zeroed here, each query's sum is the same as unchunked. Causal only (future gates are always excluded).

`max_pos` (the paper's p_max, the number of position embeddings) defaults to 64, a choice of posenc's that cites
nothing: the paper's code takes it as a constructor argument with no default, and no value for it was found stated
in the paper. 64 is half of `model=tiny`'s 128-token training length; counts beyond max_pos − 1 are clamped.

Position ids: CoPE ignores them. Its positions are counted by the gates over the keys a query sees, and which keys
those are is token order (the hook's q_pos, k_pos are token indexes), never the ids: gating by ids would let a future
token with a repeated or smaller id into a query's count. So CoPE is trivially `relative` (ids change nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional import register
from posenc_cli.positional.base import PositionalScheme, PositionContext


@dataclass(kw_only=True)
class CopeConfig(PosConfig):
    name: str = "cope"
    max_pos: int = 64

    def validate(self) -> None:
        if self.max_pos < 2:
            raise ConfigError(f"pos.max_pos must be >= 2, got {self.max_pos}")


def cope_gates(q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """q (B, H, Tq, d), k (B, H, Tk, d) -> (B, H, Tq, Tk) fp32 gates σ(q·k/√d), 0 where k_pos > q_pos."""
    scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    future = k_pos[None, :] > q_pos[:, None]  # (Tq, Tk)
    return torch.sigmoid(scores).masked_fill(future, 0.0)


def cope_positions(gates: Tensor, max_pos: int) -> Tensor:
    """gates (..., Tq, Tk) (future already 0) -> p_ij = Σ_{t ≥ j} g_it (reverse cumsum over keys), ≤ max_pos − 1."""
    return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=max_pos - 1)


def interpolate_logits(int_logits: Tensor, positions: Tensor) -> Tensor:
    """int_logits (..., Tq, P) = q·e[n] for n = 0..P−1, positions (..., Tq, Tk) in [0, P−1] -> (..., Tq, Tk):
    (1 − w)·logit[⌊p⌋] + w·logit[⌊p⌋ + 1], w = p − ⌊p⌋, which is the paper's floor/ceil interpolation (w = 0 when
    ⌈p⌉ = ⌊p⌋). The gradient reaches p through w; at an integer p it is the right derivative logit[p+1] − logit[p]
    (the paper's code gives 0 there), a case that only arises for saturated gates or at the clamp, where the clamp
    already stops the gradient. One index tensor instead of two: about 2× faster on CPU."""
    floor = positions.floor()
    index = floor.long()
    upper = torch.cat([int_logits[..., 1:], int_logits[..., -1:]], dim=-1)  # (..., Tq, P): logit[n + 1], capped
    return torch.lerp(int_logits.gather(-1, index), upper.gather(-1, index), positions - floor)


def cope_bias(q: Tensor, k: Tensor, emb: Tensor, q_pos: Tensor, k_pos: Tensor, max_pos: int) -> Tensor:
    """q (B, H, Tq, d), k (B, H, Tk, d), emb (max_pos, d) -> (B, H, Tq, Tk) fp32 bias q_i·e[p_ij].

    Always in fp32, also under autocast: gate sums over thousands of keys would lose whole positions in bf16."""
    with torch.autocast(q.device.type, enabled=False):
        positions = cope_positions(cope_gates(q, k, q_pos, k_pos), max_pos)  # (B, H, Tq, Tk)
        int_logits = q.float() @ emb.float().t()  # (B, H, Tq, max_pos)
        return interpolate_logits(int_logits, positions)


@register
class CoPE(PositionalScheme):
    name = "cope"
    config_cls = CopeConfig
    hooks = ("bias",)
    paper = "Golovneva et al. 2024, arXiv:2405.18719"
    relative = True  # ids are ignored (see the module docstring)
    causal_only = True  # p_ij counts the gates of keys j..i

    def __init__(self, cfg: CopeConfig, model: ModelConfig, train_length: int) -> None:
        super().__init__(cfg, model, train_length)
        self.max_pos = cfg.max_pos
        self.pos_emb = nn.Parameter(torch.zeros(model.n_layer, cfg.max_pos, model.head_dim))  # (L, P, hd)

    def bias(
        self, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, ctx: PositionContext
    ) -> Tensor | None:
        return cope_bias(q, k, self.pos_emb[layer], q_pos, k_pos, self.max_pos)
