"""Per-query attention temperatures a layout gives a layer: factors that multiply q before attention.

- `FloorLog` (Llama 4's `attn_temperature_tuning` on its NoPE layers, `transformers`
  `models/llama4/modeling_llama4.py`, `Llama4TextAttention.forward`): q × (1 + a·log1p(⌊(n + 1)/F⌋)) for the
  query at token index n, `attn_scale` a = 0.1 and `floor_scale` F = 8192 by default (`Llama4TextConfig`). It is
  applied in training and inference alike, from the token's cache position (its index, not a remapped id).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class FloorLog:
    """Llama 4's floor-log temperature: `scale` a and `floor` F (tokens)."""

    scale: float
    floor: int

    def factor(self, token_index: Tensor) -> Tensor:
        """(T,) token indexes -> (T,) fp32 factors 1 + a·log1p(⌊(n + 1)/F⌋) (1 for n + 1 < F)."""
        n = token_index.to(torch.float32)
        return torch.log1p(torch.floor((n + 1.0) / self.floor)) * self.scale + 1.0

    def describe(self) -> str:
        return f"floor-log temperature a={self.scale:g}, F={self.floor}"
