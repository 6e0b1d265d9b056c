"""Learned absolute positions: x_t ← x_t + E[t], E ∈ R^(L×D) trained with the model (GPT-2, BERT).

L is the training length, so the table has no row for positions ≥ L: longer inputs raise `LengthBeyondScheme`
(evaluation reports them as "n/a"). With position ids, row E[id] is added, and ids ≥ L are refused the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.positional import register
from posenc_cli.positional.base import PositionalScheme, PositionContext


@dataclass(kw_only=True)
class LearnedConfig(PosConfig):
    name: str = "learned"


@register
class Learned(PositionalScheme):
    name = "learned"
    config_cls = LearnedConfig
    hooks = ("embed",)
    extrapolates = False
    paper = "Radford et al. 2019 (GPT-2); Devlin et al. 2019 (BERT)"

    def __init__(self, cfg: LearnedConfig, model: ModelConfig, train_length: int) -> None:
        super().__init__(cfg, model, train_length)
        self.wpe = nn.Embedding(train_length, model.d_model)
        nn.init.normal_(self.wpe.weight, mean=0.0, std=model.embed_init_std)  # fairseq: N(0, 1/D) as its tokens

    @property
    def max_length(self) -> int | None:
        return self.train_length

    def embed(self, x: Tensor, ctx: PositionContext) -> Tensor:
        return x + self.wpe(ctx.positions).to(x.dtype)  # (B, T, D) + (T, D) or (B, T, D)
