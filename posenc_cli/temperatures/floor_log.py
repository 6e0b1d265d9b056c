"""Llama 4's floor-log query temperature (`attn_temperature_tuning` on its NoPE layers; `transformers`
`models/llama4/modeling_llama4.py`, `Llama4TextAttention.forward`): q × (1 + a·log1p(⌊(n + 1)/F⌋)) for the query at
token index n, `attn_scale` a = 0.1 and `floor_scale` F = 8192 by default (`Llama4TextConfig`). Applied in training
and inference alike, from the token's cache position (its index, not a remapped id); multiplied in fp32, then cast,
as transformers does. A layout gives it per layer (`pos.layers[i].temperature`, `positional.layout`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posenc_cli.temperatures import register
from posenc_cli.temperatures.base import Temperature


@register
@dataclass(frozen=True)
class FloorLog(Temperature):
    """Llama 4's floor-log temperature: `scale` a and `floor` F (tokens)."""

    name = "floor-log"
    paper = "Llama 4 attn_temperature_tuning (transformers modeling_llama4.py)"
    scale: float
    floor: int

    def factor(self, token_index: Tensor) -> Tensor:
        """(T,) token indexes -> (T,) fp32 factors 1 + a·log1p(⌊(n + 1)/F⌋) (1 for n + 1 < F)."""
        n = token_index.to(torch.float32)
        return torch.log1p(torch.floor((n + 1.0) / self.floor)) * self.scale + 1.0

    def table(self, positions: Tensor, token_index: Tensor, cell_length: int) -> Tensor:
        return self.factor(token_index)[:, None]  # (T, 1)

    def apply(self, q: Tensor, rows: Tensor | None, param: Tensor | None) -> Tensor:
        return (q * self.query_factor(rows, param)).to(q.dtype)  # fp32 product, then q's dtype (transformers' order)

    def unit_below(self) -> int:
        return self.floor - 1

    def describe(self) -> str:
        return f"floor-log temperature a={self.scale:g}, F={self.floor}"
