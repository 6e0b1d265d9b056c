"""Qwen's log-n attention scaling (`use_logn_attn`, Qwen `modeling_qwen.py`): query n's logits × max(1, log n / log L),
n = position id + 1, L the training length (`model.logn_length`). Identity (1) up to L."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc_cli.config import ModelConfig
from posenc_cli.temperatures import register
from posenc_cli.temperatures.base import Temperature


def logn_factor(positions: Tensor, length: int) -> Tensor:
    """max(1, log(n)/log(L)) fp32 for n = position id + 1, shaped like `positions` (T,) or (B, T). Identity (1) at
    n ≤ L; multiplying q by it multiplies query n's logits by it."""
    n = positions.to(torch.float32) + 1
    return (n.log() / math.log(length)).clamp_min(1.0)


@register
@dataclass(frozen=True)
class LogN(Temperature):
    """`length` L (tokens, >= 2)."""

    name = "logn"
    paper = "Qwen use_logn_attn (Bai et al. 2023, arXiv 2309.16609)"
    length: int

    @classmethod
    def from_model(cls, cfg: ModelConfig) -> LogN:
        return cls(cfg.logn_length)

    def table(self, positions: Tensor, token_index: Tensor, cell_length: int) -> Tensor:
        f = logn_factor(positions, self.length)[..., None]  # (T, 1) or (B, T, 1)
        return f if f.dim() == 2 else f.unsqueeze(-3)  # (T, 1) or (B, 1, T, 1)

    def unit_below(self) -> int:
        return self.length  # (for the default ids, where the id is the token index)

    def describe(self) -> str:
        return f"log-n: max(1, log n / log {self.length})"
