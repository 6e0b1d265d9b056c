"""YaRN ("NTK-by-parts" + temperature), Peng et al. 2023 (arXiv 2309.00071, ICLR 2024) Eq. 17-22, HF semantics.

correction_dim(r) = d·ln(L/(2π·r)) / (2·ln base) is the pair whose wavelength fits r times in L; the ramp runs from
low = floor(correction_dim(β_fast)) to high = ceil(correction_dim(β_slow)) (no rounding without `truncate`), clamped
to [0, d-1]; ramp_k = clamp((k - low)/(high - low), 0, 1) and inv_k' = (inv_k/s)·ramp_k + inv_k·(1 - ramp_k).
Attention factor √(1/t) = 0.1·ln s + 1 on cos and sin (Eq. 22), unless given. transformers: rope_type yarn.

DeepSeek's `mscale` m and `mscale_all_dim` m' (transformers `rope_parameters` keys, `_compute_yarn_parameters`):
with both set (and no `attention_factor`) the factor is get_mscale(s, m)/get_mscale(s, m'), get_mscale(s, m) =
0.1·m·ln s + 1 for s > 1, else 1; with one of them unset it stays 0.1·ln s + 1. transformers' MLA models (DeepSeek
V2/V3) also multiply their softmax scale by get_mscale(s, m')² (`yarn_apply_mscale`); posenc has no MLA attention,
so, as for transformers' Llama-style models, only the factor on cos and sin applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from posenc_cli.errors import ConfigError
from posenc_cli.rope_scaling import ScalingMethod, ScalingParams, TransformersRope, param, register

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["YaRN", "YarnParams", "yarn_attention_factor", "yarn_correction_range", "yarn_get_mscale", "yarn_ramp"]


@dataclass(frozen=True, kw_only=True)
class YarnParams(ScalingParams):
    beta_fast: float = param(32.0, help="YaRN: β_fast.", positive=True)
    beta_slow: float = param(1.0, help="YaRN: β_slow.", positive=True)
    attention_factor: float | None = param(
        None,
        help="YaRN, LongRoPE: factor on cos and sin (default: YaRN 0.1·ln s + 1, LongRoPE √(1 + ln s / ln L)).",
        metavar="F",
        positive=True,
    )
    truncate: bool = param(True, help="YaRN: round the ramp's ends to whole pairs.")
    mscale: float | None = param(
        None, help="YaRN: DeepSeek's mscale m, with --mscale-all-dim: factor (0.1·m·ln s + 1)/(0.1·m'·ln s + 1).",
        metavar="M", positive=True,
    )  # fmt: skip
    mscale_all_dim: float | None = param(
        None, help="YaRN: DeepSeek's mscale_all_dim m', the divisor's (see --mscale).", metavar="M", positive=True
    )


def yarn_get_mscale(factor: float, mscale: float = 1.0) -> float:
    """0.1·m·ln s + 1 for s > 1, else 1 (YaRN paper Eq. 22 with DeepSeek's multiplier m; `transformers`'
    `yarn_get_mscale`)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """YaRN's factor on cos and sin when none is given: get_mscale(s, m)/get_mscale(s, m') with both DeepSeek
    multipliers set (non-zero), else √(1/t) = 0.1·ln s + 1 (paper Eq. 22), 1 for s <= 1 (`transformers`'
    `_compute_yarn_parameters`)."""
    if mscale and mscale_all_dim:
        return yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    return yarn_get_mscale(factor)


def yarn_correction_range(
    head_dim: int,
    base: float,
    original_length: int,
    *,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> tuple[float, float]:
    """(low, high) pair indices of YaRN's ramp (paper Eq. 17-18 / "NTK-by-parts").

    correction_dim(r) = d·ln(L/(2π·r)) / (2·ln base) is the pair whose wavelength fits r times in L; low comes from
    beta_fast, high from beta_slow, floored/ceiled when `truncate`, then clamped to [0, d-1] (the upper clamp uses
    the rotary dim d, not d/2, exactly as `transformers` does). The +0.001 for low == high is applied in `yarn_ramp`.
    """
    if beta_fast <= 0 or beta_slow <= 0:
        raise ConfigError(f"YaRN betas must be > 0, got beta_fast={beta_fast}, beta_slow={beta_slow}")

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original_length / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return float(max(low, 0)), float(min(high, head_dim - 1))


def yarn_ramp(
    head_dim: int,
    base: float,
    original_length: int,
    *,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> Tensor:
    """ramp_k = clamp((k - low)/(high - low), 0, 1), (d/2,) float64: 0 keeps inv_k, 1 fully interpolates (inv_k/s)."""
    import torch  # deferred: extend --help and config validation read this module without torch

    low, high = yarn_correction_range(
        head_dim, base, original_length, beta_fast=beta_fast, beta_slow=beta_slow, truncate=truncate
    )
    if low == high:
        high += 0.001  # avoid 0/0, as in the reference implementation
    k = torch.arange(head_dim // 2, dtype=torch.float64)  # (d/2,)
    return ((k - low) / (high - low)).clamp(0.0, 1.0)


@register
class YaRN(ScalingMethod):
    name = "yarn"
    title = "YaRN"
    summary = "NTK-by-parts ramp between kept and interpolated pairs, plus attention temperature"
    paper = "Peng et al. 2023, arXiv:2309.00071"
    published = "2023-08-31"
    params_cls = YarnParams
    rope_type = "yarn"

    def _ramp(self, p: YarnParams, head_dim: int, base: float, original_length: int) -> Tensor:
        return yarn_ramp(
            head_dim, base, original_length, beta_fast=p.beta_fast, beta_slow=p.beta_slow, truncate=p.truncate
        )

    def inv_freq(
        self, p: YarnParams, head_dim: int, base: float, factor: float, original_length: int, seq_len: int | None
    ) -> Tensor:
        # deferred: extend --help and config validation read this module without torch
        from posenc_cli.rope_scaling.frequencies import base_inv_freq

        ramp = self._ramp(p, head_dim, base, original_length)
        inv = base_inv_freq(head_dim, base)
        return (inv / factor) * ramp + inv * (1.0 - ramp)  # Eq. 18-19: h(θ_k) = (1-γ)θ_k/s + γθ_k, γ = 1 - ramp

    def attention_factor(self, p: YarnParams, factor: float, original_length: int) -> float:
        if p.attention_factor is not None:  # used as given, whatever the factor (as in transformers)
            return p.attention_factor
        return yarn_attention_factor(factor, p.mscale, p.mscale_all_dim)

    def regions(self, p: YarnParams, head_dim: int, base: float, factor: float, original_length: int) -> dict:
        """ramp 0 → keep, 0 < ramp < 1 → blend, ramp 1 → interpolate."""
        ramp = self._ramp(p, head_dim, base, original_length)
        keep, interpolate = int((ramp == 0).sum()), int((ramp == 1).sum())
        return {"keep": keep, "blend": head_dim // 2 - keep - interpolate, "interpolate": interpolate}

    def transformers(self, p: YarnParams, factor: float, original_length: int, rotary_dim: int) -> TransformersRope:
        params = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": original_length}
        params.update(beta_fast=float(p.beta_fast), beta_slow=float(p.beta_slow), truncate=bool(p.truncate))
        if p.attention_factor is not None:
            params["attention_factor"] = float(p.attention_factor)
        for key in ("mscale", "mscale_all_dim"):
            if getattr(p, key) is not None:
                params[key] = float(getattr(p, key))
        return TransformersRope(params, 1.0, max(original_length, round(factor * original_length)))
