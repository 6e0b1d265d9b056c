"""Scalable-Softmax (SSMax, Nakanishi 2025, arXiv 2501.19399): query n's logits × s_h·log n, n the number of keys the
causal query sees (token index + 1), s_h learned per layer and head (`blocks.<i>.attn.ssmax_scale`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc_cli.config import ModelConfig
from posenc_cli.temperatures import register
from posenc_cli.temperatures.base import Temperature


def ssmax_factor(token_index: Tensor) -> Tensor:
    """log(n) fp32 (T,) for n = token index + 1, the number of keys a causal query sees."""
    return (token_index.to(torch.float32) + 1).log()


@register
@dataclass(frozen=True)
class SSMax(Temperature):
    """`length` L: s_h starts at 1/log L, so that s·log n = 1 at the training length (posenc's choice, citing
    nothing: the paper learns s per layer and head and states no initial value; its figure uses 0.43)."""

    name = "ssmax"
    paper = "Scalable-Softmax (Nakanishi 2025, arXiv 2501.19399)"
    parameter = "ssmax_scale"
    length: int

    @classmethod
    def from_model(cls, cfg: ModelConfig) -> SSMax:
        return cls(cfg.logn_length)

    def init_parameter(self, n_head: int) -> Tensor:
        return torch.full((n_head,), 1.0 / math.log(max(self.length, 2)))

    def table(self, positions: Tensor, token_index: Tensor, cell_length: int) -> Tensor:
        return ssmax_factor(token_index).to(positions.device)[:, None]  # (T, 1)

    def query_factor(self, rows: Tensor | None, param: Tensor | None) -> Tensor:
        assert rows is not None and param is not None
        return param.float()[:, None, None] * rows  # (H, 1, 1) × (T', 1) -> (H, T', 1)

    def describe(self) -> str:
        return "SSMax: s_h · log n"
