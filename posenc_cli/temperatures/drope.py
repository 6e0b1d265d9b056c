"""DroPE's evaluation temperature (Gelberg et al. 2025, arXiv 2512.12167): β(s) = 1 + c·ln s, s = test length /
training length L, c a constant fitted on held-out tokens (`posenc calibrate RUN --temperature drope`).

Two forms (`model.temperature_form`):

- `cell` (default), the reference's: one β for every query of an evaluation cell, s = the cell's length in tokens
  over L (`PositionContext.cell_tokens`: a full forward's own length unless the evaluation gives it; a KV cache keeps
  the one it was given or its first forward's, so a decoding step of one token is not a one-token cell).
  `SakanaAI/DroPE` (260a8bb) `custom_models/attention.py:95-97` (and 148-150) sets the attention module's `scaling`,
  HF's factor of q·kᵀ (1/√d by default, passed to the attention function at lines 212 and 284), to the constant
  `config.softmax_scale`: one number for every query of every forward, chosen by whoever evaluates. The repository
  computes no β (its README, configs and trainer only recalibrate), so s ≤ 1 is not defined there; posenc clamps s
  at 1 (β = 1 for a cell of at most L tokens, the model as trained), which also keeps β > 0 for any c.
- `query`, posenc's earlier per-query form (runs calibrated before the `cell` form keep it, see `config`):
  s_i = max(1, (i + 1)/L) for the query at token index i, so a query's factor never depends on the tokens after it.
  With c = 1/ln L it is Qwen's log-n (`logn`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc_cli.config import ModelConfig, TemperatureForm
from posenc_cli.temperatures import register
from posenc_cli.temperatures.base import Temperature


def beta_at(c: float, s: float) -> float:
    """The paper's β(s) = 1 + c·ln(max(1, s)): one cell's factor, s = its length over the training length."""
    return 1.0 + c * math.log(max(1.0, s))


def drope_beta(token_index: Tensor, c: float, length: int) -> Tensor:
    """The `query` form: 1 + c·ln(max(1, (i + 1)/L)) fp32 (T,) for token indexes i (T,)."""
    s = (token_index.to(torch.float32) + 1) / length
    return s.clamp_min(1.0).log() * c + 1.0


@register
@dataclass(frozen=True)
class Drope(Temperature):
    """`c` (`model.temperature_c`), `length` L (`model.logn_length`: the training length) and `form`
    (`model.temperature_form`: `cell`, one β per evaluation cell, or `query`, one per query)."""

    name = "drope"
    paper = "DroPE (Gelberg et al. 2025, arXiv 2512.12167)"
    c: float
    length: int
    form: TemperatureForm = "cell"

    @classmethod
    def from_model(cls, cfg: ModelConfig) -> Drope:
        return cls(float(cfg.temperature_c), cfg.logn_length, cfg.temperature_form)

    def table(self, positions: Tensor, token_index: Tensor, cell_length: int) -> Tensor:
        if self.form == "query":
            return drope_beta(token_index, self.c, self.length).to(positions.device)[:, None]  # (T, 1)
        beta = beta_at(self.c, cell_length / self.length)
        return torch.full((token_index.shape[-1], 1), beta, dtype=torch.float32, device=positions.device)  # (T, 1)

    def unit_below(self) -> int | None:
        return self.length if self.form == "query" else None  # cell: 1 for cells of <= L tokens, whatever the index

    def describe(self) -> str:
        if self.form == "query":
            return f"DroPE per query: 1 + {self.c:g}·ln(max(1, n / {self.length}))"
        return f"DroPE: 1 + {self.c:g}·ln(max(1, cell length / {self.length}))"
