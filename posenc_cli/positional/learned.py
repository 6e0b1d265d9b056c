"""Learned absolute positions: x_t ← x_t + E[t], E ∈ R^(L×D) trained with the model (GPT-2, BERT).

L is the training length (or `pos.table_size`, e.g. for `train.random_positions`), so the table has no row for
positions ≥ L: longer inputs raise `LengthBeyondScheme` (evaluation reports them as "n/a"). With position ids, row
E[id] is added, and ids ≥ L are refused the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional import register
from posenc_cli.positional.base import PositionalScheme, PositionContext


@dataclass(kw_only=True)
class LearnedConfig(PosConfig):
    name: str = "learned"
    table_size: int | None = None  # rows of the table (None: the training length); e.g. train.random_positions

    def validate(self) -> None:
        if self.table_size is not None and self.table_size < 1:
            raise ConfigError(f"pos.table_size must be >= 1, got {self.table_size}")


@register
class Learned(PositionalScheme):
    name = "learned"
    config_cls = LearnedConfig
    hooks = ("embed",)
    extrapolates = False
    paper = "Radford et al. 2019 (GPT-2); Devlin et al. 2019 (BERT)"

    def __init__(self, cfg: LearnedConfig, model: ModelConfig, train_length: int) -> None:
        super().__init__(cfg, model, train_length)
        self.table_size = cfg.table_size or train_length
        self.wpe = nn.Embedding(self.table_size, model.d_model)
        nn.init.normal_(self.wpe.weight, mean=0.0, std=model.embed_init_std)  # fairseq: N(0, 1/D) as its tokens

    @property
    def max_length(self) -> int | None:
        return self.table_size

    def embed(self, x: Tensor, ctx: PositionContext) -> Tensor:
        return x + self.wpe(ctx.positions).to(x.dtype)  # (B, T, D) + (T, D) or (B, T, D)
