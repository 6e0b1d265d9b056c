"""RoPE frequency scaling (linear/PI, NTK-aware, dynamic NTK, YaRN, Llama 3): pure maths on inverse frequencies.

Formulas: ../shared/reference/rope-scaling.md. Convention: the returned attention factor multiplies both cos and
sin (so attention logits scale by its square), as in `transformers`' `_compute_*_parameters`, whose numbers these
functions reproduce (tests/positional/test_scaling.py checks them against it).

Notation: d = rotary dim (`head_dim`), s = `factor`, L = `original_length`, inv_k = base^(-2k/d), k = 0..d/2-1.
Everything is computed in float64 and returned as float32 on the CPU; callers move it to their device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from posenc_cli.errors import ConfigError

__all__ = [
    "METHODS",
    "RopeScalingConfig",
    "ScalingMethod",
    "frequency_regions",
    "llama3_wavelength_thresholds",
    "scaled_inv_freq",
    "scaled_inv_freq_for",
    "yarn_attention_factor",
    "yarn_correction_range",
    "yarn_ramp",
]

ScalingMethod = Literal["none", "linear", "ntk", "dynamic", "yarn", "llama3"]
METHODS: tuple[str, ...] = ("none", "linear", "ntk", "dynamic", "yarn", "llama3")

# Keys `scaled_inv_freq` accepts in **params (None means "use the default"); irrelevant ones are ignored per method.
_PARAM_KEYS = frozenset(
    {"beta_fast", "beta_slow", "attention_factor", "truncate", "low_freq_factor", "high_freq_factor", "mscale",
     "mscale_all_dim"}
)  # fmt: skip


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


# ---------------------------------------------------------------------------------------------------------- helpers


def _check_common(
    method: str, head_dim: int, base: float, factor: float, original_length: int, params: dict[str, object]
) -> None:
    unknown = set(params) - _PARAM_KEYS
    if unknown:
        raise ConfigError(f"unknown RoPE scaling parameter(s): {', '.join(sorted(unknown))}")
    if method not in METHODS:
        raise ConfigError(f"unknown RoPE scaling method '{method}' (available: {', '.join(METHODS)})")
    if head_dim < 2 or head_dim % 2:
        raise ConfigError(f"RoPE rotary dim must be even and >= 2, got {head_dim}")
    if method in ("ntk", "dynamic") and head_dim < 4:
        raise ConfigError(f"RoPE scaling '{method}' needs a rotary dim >= 4, got {head_dim}")
    if not base > 1.0:
        raise ConfigError(f"RoPE base must be > 1, got {base}")
    if not factor >= 1.0:
        raise ConfigError(f"RoPE scaling factor must be >= 1, got {factor}")
    if original_length < 1:
        raise ConfigError(f"RoPE scaling original_length must be >= 1, got {original_length}")


def _param(params: dict[str, float | bool | None], key: str, default: float) -> float:
    value = params.get(key)
    return default if value is None else float(value)


def _base_inv_freq(head_dim: int, base: float) -> Tensor:
    """inv_k = base^(-2k/d), (d/2,) float64."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim  # (d/2,)
    return base**-exponents


def _ntk_inv_freq(head_dim: int, base: float, scale: float) -> Tensor:
    """NTK-aware base change base' = base · scale^(d/(d-2)) (YaRN paper Eq. 16); pair k is divided by s^(2k/(d-2))."""
    return _base_inv_freq(head_dim, base * scale ** (head_dim / (head_dim - 2)))


def yarn_attention_factor(factor: float, *, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """Default YaRN factor on cos and sin: √(1/t) = 0.1·ln s + 1 (paper Eq. 22), 1 for s <= 1.

    As in `transformers`: when both `mscale` and `mscale_all_dim` are given (DeepSeek style) it is
    (0.1·mscale·ln s + 1) / (0.1·mscale_all_dim·ln s + 1).
    """

    def get(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if mscale and mscale_all_dim:
        return get(mscale) / get(mscale_all_dim)
    return get(1.0)


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
    low, high = yarn_correction_range(
        head_dim, base, original_length, beta_fast=beta_fast, beta_slow=beta_slow, truncate=truncate
    )
    if low == high:
        high += 0.001  # avoid 0/0, as in the reference implementation
    k = torch.arange(head_dim // 2, dtype=torch.float64)  # (d/2,)
    return ((k - low) / (high - low)).clamp(0.0, 1.0)


def llama3_wavelength_thresholds(
    original_length: int, low_freq_factor: float, high_freq_factor: float
) -> tuple[float, float]:
    """(high_freq_wavelen, low_freq_wavelen) = (L/high_freq_factor, L/low_freq_factor)."""
    if not 0 < low_freq_factor < high_freq_factor:
        raise ConfigError(
            f"llama3 scaling needs 0 < low_freq_factor < high_freq_factor, got {low_freq_factor} and {high_freq_factor}"
        )
    return original_length / high_freq_factor, original_length / low_freq_factor


# ---------------------------------------------------------------------------------------------------------- methods


def _yarn(
    head_dim: int, base: float, factor: float, original_length: int, params: dict[str, float | bool | None]
) -> tuple[Tensor, float]:
    truncate = params.get("truncate")
    ramp = yarn_ramp(
        head_dim,
        base,
        original_length,
        beta_fast=_param(params, "beta_fast", 32.0),
        beta_slow=_param(params, "beta_slow", 1.0),
        truncate=True if truncate is None else bool(truncate),
    )
    inv = _base_inv_freq(head_dim, base)
    inv = (inv / factor) * ramp + inv * (1.0 - ramp)  # paper Eq. 18-19: h(θ_k) = (1-γ)θ_k/s + γθ_k, γ = 1 - ramp
    explicit = params.get("attention_factor")
    if explicit is not None:  # used as given, whatever the factor (as in transformers)
        attention = float(explicit)
    else:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        attention = yarn_attention_factor(
            factor,
            mscale=None if mscale is None else float(mscale),
            mscale_all_dim=None if mscale_all_dim is None else float(mscale_all_dim),
        )
    return inv, attention


def _llama3(
    head_dim: int, base: float, factor: float, original_length: int, params: dict[str, float | bool | None]
) -> Tensor:
    low_ff, high_ff = _param(params, "low_freq_factor", 1.0), _param(params, "high_freq_factor", 4.0)
    high_wavelen, low_wavelen = llama3_wavelength_thresholds(original_length, low_ff, high_ff)
    inv = _base_inv_freq(head_dim, base)
    wavelen = 2 * math.pi / inv  # (d/2,)
    smooth = (original_length / wavelen - low_ff) / (high_ff - low_ff)
    blended = (1.0 - smooth) * inv / factor + smooth * inv
    out = torch.where(wavelen > low_wavelen, inv / factor, blended)
    return torch.where(wavelen < high_wavelen, inv, out)


def scaled_inv_freq(
    method: str,
    head_dim: int,
    base: float,
    factor: float,
    original_length: int,
    seq_len: int | None = None,
    **params: float | bool | None,
) -> tuple[Tensor, float]:
    """(inv_freq (head_dim//2,) float32, attention_factor) of a scaled RoPE; same contract as `transformers`.

    The attention factor multiplies both cos and sin, so attention logits scale by attention_factor².

    - none: inv_k = base^(-2k/d), attention 1.
    - linear (PI, Chen et al. 2023): inv_k / s.
    - ntk (NTK-aware static, YaRN paper Eq. 16): base' = base · s^(d/(d-2)).
    - dynamic (dynamic NTK): base' = base · (s·n/L - (s-1))^(d/(d-2)), n = max(seq_len, L); plain RoPE when
      seq_len is None or <= L. Recompute it per sequence length.
    - yarn (Peng et al. 2023, Eq. 17-22): ramp between inv_k (fast pairs) and inv_k/s (slow pairs), see `yarn_ramp`;
      params beta_fast (32), beta_slow (1), truncate (True); attention factor = params["attention_factor"] when given,
      else 0.1·ln s + 1 (or the mscale/mscale_all_dim ratio, see `yarn_attention_factor`).
    - llama3: wavelength λ_k = 2π/inv_k; λ > L/low_freq_factor → inv_k/s, λ < L/high_freq_factor → inv_k, in between
      (1-g)·inv_k/s + g·inv_k with g = (L/λ - low)/(high - low); params low_freq_factor (1), high_freq_factor (4).

    `params` may hold any of the `RopeScalingConfig` fields plus mscale/mscale_all_dim; None means default and
    fields a method does not use are ignored. Raises ConfigError for an unknown method, factor < 1 or bad params.
    """
    _check_common(method, head_dim, base, factor, original_length, params)
    attention = 1.0
    if method == "none":
        inv = _base_inv_freq(head_dim, base)
    elif method == "linear":
        inv = _base_inv_freq(head_dim, base) / factor
    elif method == "ntk":
        inv = _ntk_inv_freq(head_dim, base, factor)
    elif method == "dynamic":
        n = original_length if seq_len is None else max(seq_len, original_length)
        inv = _ntk_inv_freq(head_dim, base, factor * n / original_length - (factor - 1))
    elif method == "yarn":
        inv, attention = _yarn(head_dim, base, factor, original_length, params)
    else:  # llama3
        inv = _llama3(head_dim, base, factor, original_length, params)
    return inv.to(torch.float32), attention


def scaled_inv_freq_for(
    cfg: RopeScalingConfig, head_dim: int, base: float, train_length: int, seq_len: int | None = None
) -> tuple[Tensor, float]:
    """`scaled_inv_freq` for a config; L = cfg.original_length, or `train_length` when that is None."""
    original_length = cfg.original_length if cfg.original_length is not None else train_length
    return scaled_inv_freq(
        cfg.method,
        head_dim,
        base,
        cfg.factor,
        original_length,
        seq_len,
        beta_fast=cfg.beta_fast,
        beta_slow=cfg.beta_slow,
        attention_factor=cfg.attention_factor,
        truncate=cfg.truncate,
        low_freq_factor=cfg.low_freq_factor,
        high_freq_factor=cfg.high_freq_factor,
    )


def frequency_regions(
    method: str, head_dim: int, base: float, factor: float, original_length: int, **params: float | bool | None
) -> dict[str, int]:
    """How many of the d/2 frequency pairs keep their frequency, are blended, or are fully interpolated (inv_k/s).

    - none: all keep. linear: all interpolate.
    - yarn: from `yarn_ramp`: ramp 0 → keep, 0 < ramp < 1 → blend, ramp 1 → interpolate.
    - llama3: λ_k < L/high_freq_factor → keep, λ_k > L/low_freq_factor → interpolate, else blend.
    - ntk: inv_k' = inv_k · s^(-2k/(d-2)), so pair 0 keeps, the last pair is exactly inv/s and the d/2 - 2 pairs in
      between are blended. dynamic is reported with the same split (it is NTK with a length-dependent factor; below
      L nothing changes). With factor 1 every method reports all pairs as keep.
    Returns dict(keep=int, blend=int, interpolate=int) summing to head_dim // 2.
    """
    _check_common(method, head_dim, base, factor, original_length, params)
    pairs = head_dim // 2
    if method == "none" or factor == 1.0:
        return {"keep": pairs, "blend": 0, "interpolate": 0}
    if method == "linear":
        return {"keep": 0, "blend": 0, "interpolate": pairs}
    if method in ("ntk", "dynamic"):
        return {"keep": 1, "blend": pairs - 2, "interpolate": 1}
    if method == "yarn":
        truncate = params.get("truncate")
        ramp = yarn_ramp(
            head_dim,
            base,
            original_length,
            beta_fast=_param(params, "beta_fast", 32.0),
            beta_slow=_param(params, "beta_slow", 1.0),
            truncate=True if truncate is None else bool(truncate),
        )
        keep, interpolate = int((ramp == 0).sum()), int((ramp == 1).sum())
    else:  # llama3
        high_wavelen, low_wavelen = llama3_wavelength_thresholds(
            original_length, _param(params, "low_freq_factor", 1.0), _param(params, "high_freq_factor", 4.0)
        )
        wavelen = 2 * math.pi / _base_inv_freq(head_dim, base)
        keep, interpolate = int((wavelen < high_wavelen).sum()), int((wavelen > low_wavelen).sum())
    return {"keep": keep, "blend": pairs - keep - interpolate, "interpolate": interpolate}
