"""DroPE's evaluation temperature (Gelberg et al. 2025, arXiv 2512.12167): β = 1 + c·ln(s), s = test length /
training length, c a constant fitted on held-out tokens (`posenc calibrate RUN --temperature drope`).

The reference code multiplies the logits by one constant: `SakanaAI/DroPE` `custom_models/attention.py:95-97` (and
148-150) sets the attention module's `scaling` (HF's factor of q·kᵀ, 1/√d by default, passed to the attention
function at lines 212 and 284) to `config.softmax_scale`, the same for every query; the repository holds no fit of
c (its README, configs and trainer only recalibrate). posenc applies s per query instead, s_i = (i + 1)/L for the
query at token index i (the keys it sees over the training length L), clamped at 1: the last query of a window of
s·L tokens gets the paper's β(s), queries up to L get exactly 1, and a token's factor never depends on how many
tokens follow it, so the KV cache and streaming evaluation give the full forward's numbers. With c = 1/ln L this is
Qwen's log-n (`logn`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc_cli.config import ModelConfig
from posenc_cli.temperatures import register
from posenc_cli.temperatures.base import Temperature


def drope_beta(token_index: Tensor, c: float, length: int) -> Tensor:
    """1 + c·ln(max(1, (i + 1)/L)) fp32 (T,) for token indexes i (T,)."""
    s = (token_index.to(torch.float32) + 1) / length
    return s.clamp_min(1.0).log() * c + 1.0


@register
@dataclass(frozen=True)
class Drope(Temperature):
    """`c` (`model.temperature_c`, >= 0) and `length` L (`model.logn_length`: the training length)."""

    name = "drope"
    paper = "DroPE (Gelberg et al. 2025, arXiv 2512.12167)"
    c: float
    length: int

    @classmethod
    def from_model(cls, cfg: ModelConfig) -> Drope:
        return cls(float(cfg.temperature_c), cfg.logn_length)

    def table(self, positions: Tensor, token_index: Tensor) -> Tensor:
        return drope_beta(token_index, self.c, self.length).to(positions.device)[:, None]  # (T, 1)

    def unit_below(self) -> int:
        return self.length

    def describe(self) -> str:
        return f"DroPE: 1 + {self.c:g}·ln(max(1, n / {self.length}))"


def beta_at(c: float, s: float) -> float:
    """The paper's β(s) = 1 + c·ln(s) (s >= 1)."""
    return 1.0 + c * math.log(s)
