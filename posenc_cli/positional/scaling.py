"""RoPE frequency scaling (linear/PI, NTK-aware, dynamic NTK, YaRN, Llama 3): pure maths on inverse frequencies.

Formulas: ../shared/reference/rope-scaling.md. Convention: the returned attention factor multiplies both cos and
sin (so attention logits scale by its square), as in `transformers`' `_compute_*_parameters`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor

ScalingMethod = Literal["none", "linear", "ntk", "dynamic", "yarn", "llama3"]


@dataclass(kw_only=True)
class RopeScalingConfig:
    """How a RoPE checkpoint's frequencies are rescaled; `method: none` is a plain RoPE model."""

    method: ScalingMethod = "none"
    factor: float = 1.0
    original_length: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    truncate: bool = True
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0


def scaled_inv_freq(
    method: str,
    head_dim: int,
    base: float,
    factor: float,
    original_length: int,
    seq_len: int | None = None,
    **params: float | bool | None,
) -> tuple[Tensor, float]:
    """(inv_freq (head_dim/2,), attention_factor) for `method`; see module docstring. To be implemented."""
    raise NotImplementedError
