"""Llama 3 (the Llama 3.1 release; transformers rope_type llama3, all four values required).

Wavelength λ_k = 2π/inv_k: λ_k > L/low_freq_factor → inv_k/s; λ_k < L/high_freq_factor → inv_k unchanged; in between
(1 − g)·inv_k/s + g·inv_k with g = (L/λ_k − low)/(high − low). Llama 3.1 ships s = 8, low = 1, high = 4, L = 8192.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from posenc_cli.errors import ConfigError
from posenc_cli.rope_scaling import ScalingMethod, ScalingParams, TransformersRope, param, register

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["Llama3", "Llama3Params", "llama3_wavelength_thresholds"]


@dataclass(frozen=True, kw_only=True)
class Llama3Params(ScalingParams):
    low_freq_factor: float = param(1.0, help="llama3: low-frequency factor.", positive=True)
    high_freq_factor: float = param(4.0, help="llama3: high-frequency factor.", positive=True)


def llama3_wavelength_thresholds(
    original_length: int, low_freq_factor: float, high_freq_factor: float
) -> tuple[float, float]:
    """(high_freq_wavelen, low_freq_wavelen) = (L/high_freq_factor, L/low_freq_factor)."""
    if not 0 < low_freq_factor < high_freq_factor:
        raise ConfigError(
            f"llama3 scaling needs 0 < low_freq_factor < high_freq_factor, got {low_freq_factor} and {high_freq_factor}"
        )
    return original_length / high_freq_factor, original_length / low_freq_factor


@register
class Llama3(ScalingMethod):
    name = "llama3"
    title = "llama3"
    summary = "Llama 3.1's per-wavelength blend of kept and interpolated frequencies"
    paper = "Llama 3.1 release (Meta 2024); transformers rope_type llama3"
    published = "2024-07-23"
    params_cls = Llama3Params
    rope_type = "llama3"

    def inv_freq(
        self, p: Llama3Params, head_dim: int, base: float, factor: float, original_length: int, seq_len: int | None
    ) -> Tensor:
        # deferred: extend --help and config validation read this module without torch
        import torch

        from posenc_cli.rope_scaling.frequencies import base_inv_freq

        low_ff, high_ff = p.low_freq_factor, p.high_freq_factor
        high_wavelen, low_wavelen = llama3_wavelength_thresholds(original_length, low_ff, high_ff)
        inv = base_inv_freq(head_dim, base)
        wavelen = 2 * math.pi / inv  # (d/2,)
        smooth = (original_length / wavelen - low_ff) / (high_ff - low_ff)
        blended = (1.0 - smooth) * inv / factor + smooth * inv
        out = torch.where(wavelen > low_wavelen, inv / factor, blended)
        return torch.where(wavelen < high_wavelen, inv, out)

    def regions(self, p: Llama3Params, head_dim: int, base: float, factor: float, original_length: int) -> dict:
        """λ_k < L/high_freq_factor → keep, λ_k > L/low_freq_factor → interpolate, else blend."""
        # deferred: extend --help and config validation read this module without torch
        from posenc_cli.rope_scaling.frequencies import base_inv_freq

        high_wavelen, low_wavelen = llama3_wavelength_thresholds(original_length, p.low_freq_factor, p.high_freq_factor)
        wavelen = 2 * math.pi / base_inv_freq(head_dim, base)
        keep, interpolate = int((wavelen < high_wavelen).sum()), int((wavelen > low_wavelen).sum())
        return {"keep": keep, "blend": head_dim // 2 - keep - interpolate, "interpolate": interpolate}

    def transformers(self, p: Llama3Params, factor: float, original_length: int, rotary_dim: int) -> TransformersRope:
        params = {"rope_type": "llama3", "factor": float(factor), "original_max_position_embeddings": original_length}
        params.update(low_freq_factor=float(p.low_freq_factor), high_freq_factor=float(p.high_freq_factor))
        return TransformersRope(params, 1.0, max(original_length, round(factor * original_length)))
