"""The maths every RoPE scaling caller shares: the base and NTK-aware inverse frequencies the methods build on, and
the entry points `scaled_inv_freq`, `frequency_regions` and `frequency_summary`, which look a method up by name.

Apart from the registry (`posenc_cli.rope_scaling`) because it needs torch, which the registry, and the config schema
above it, do not. Notation and conventions: the package docstring.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc_cli.errors import ConfigError
from posenc_cli.rope_scaling import NONE, Regions, ScalingMethod, get_method, make_params, param_fields

# ---------------------------------------------------------------------------------------- shared maths helpers


def base_inv_freq(head_dim: int, base: float) -> Tensor:
    """inv_k = base^(-2k/d), (d/2,) float64."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim  # (d/2,)
    return base**-exponents


def ntk_inv_freq(head_dim: int, base: float, scale: float) -> Tensor:
    """NTK-aware base change base' = base · scale^(d/(d-2)) (YaRN paper Eq. 16); pair k is divided by s^(2k/(d-2))."""
    return base_inv_freq(head_dim, base * scale ** (head_dim / (head_dim - 2)))


def _check_common(
    method: str, head_dim: int, base: float, factor: float, original_length: int, params: dict[str, object]
) -> ScalingMethod | None:
    unknown = set(params) - set(param_fields())
    if unknown:
        raise ConfigError(f"unknown RoPE scaling parameter(s): {', '.join(sorted(unknown))}")
    spec = None if method == NONE else get_method(method)
    if head_dim < 2 or head_dim % 2:
        raise ConfigError(f"RoPE rotary dim must be even and >= 2, got {head_dim}")
    if spec is not None and head_dim < spec.min_rotary_dim:
        raise ConfigError(f"RoPE scaling '{method}' needs a rotary dim >= {spec.min_rotary_dim}, got {head_dim}")
    if not base > 1.0:
        raise ConfigError(f"RoPE base must be > 1, got {base}")
    if not factor >= 1.0:
        raise ConfigError(f"RoPE scaling factor must be >= 1, got {factor}")
    if original_length < 1:
        raise ConfigError(f"RoPE scaling original_length must be >= 1, got {original_length}")
    return spec


# ------------------------------------------------------------------------------------------ the public entry points


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

    The attention factor multiplies both cos and sin, so attention logits scale by attention_factor². `method` is
    "none" (inv_k = base^(-2k/d), attention 1) or a registered method (see its module for its formula);
    `seq_len` matters only to length-dependent methods (dynamic: recompute it per sequence length). `params` may
    hold any method's parameters (None means the default; those the method does not use are ignored). Raises
    ConfigError for an unknown method or parameter, factor < 1 or bad parameters.
    """
    spec = _check_common(method, head_dim, base, factor, original_length, params)
    if spec is None:
        return base_inv_freq(head_dim, base).to(torch.float32), 1.0
    p = make_params(spec, params)
    inv = spec.inv_freq(p, head_dim, base, factor, original_length, seq_len)
    return inv.to(torch.float32), spec.attention_factor(p, factor, original_length)


def frequency_regions(
    method: str, head_dim: int, base: float, factor: float, original_length: int, **params: float | bool | None
) -> Regions:
    """How many of the d/2 frequency pairs keep their frequency, are blended, or are fully interpolated (inv_k/s).

    none, or factor 1: all keep; otherwise the method's own `regions` (see its module).
    Returns dict(keep=int, blend=int, interpolate=int) summing to head_dim // 2.
    """
    spec = _check_common(method, head_dim, base, factor, original_length, params)
    if spec is None or factor == 1.0:
        return {"keep": head_dim // 2, "blend": 0, "interpolate": 0}
    return spec.regions(make_params(spec, params), head_dim, base, factor, original_length)


def frequency_summary(
    method: str, head_dim: int, base: float, factor: float, original_length: int, **params: float | bool | None
) -> tuple[float, Regions, tuple[float, float]]:
    """(attention factor, regions, longest wavelength in tokens before/after) for `extend`'s before/after table;
    a length-dependent method is shown at s·L tokens. Raises ConfigError for bad parameters."""
    spec = get_method(method)
    before, _ = scaled_inv_freq(NONE, head_dim, base, 1.0, original_length)
    seq_len = round(factor * original_length) if spec.length_dependent else None
    after, attention = scaled_inv_freq(method, head_dim, base, factor, original_length, seq_len, **params)
    regions = frequency_regions(method, head_dim, base, factor, original_length, **params)
    wavelengths = (2 * math.pi / float(before.min()), 2 * math.pi / float(after.min()))
    return float(attention), regions, wavelengths
