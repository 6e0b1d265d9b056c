"""The range of scale factors `extend` accepts, checked before any frequency is computed or anything is written.

Two limits, each a one-line `ConfigError`:

- the target length s·L must be a finite number of tokens below 2^31 (`MAX_TARGET_LENGTH`): position ids, the
  dynamic method's per-length rescaling and the fine-tune length are integers, and `--factor 1e308` would
  otherwise end in `OverflowError` (NTK's s^(d/(d−2)), `round(s·L)`) or `ZeroDivisionError` (a frequency that
  underflows to 0 and has no wavelength) depending on the method;
- within that, every method's scaled frequencies must come out finite and > 0 in the float32 posenc computes them
  in, with a finite attention factor (`frequency_numbers`): that bounds each method by its own formula, and LongRoPE's
  per-pair factors too (a factor of 1e308 from a `--factors` file divides a frequency down to 0).
"""

from __future__ import annotations

import math
from typing import Any

from posenc_cli.errors import ConfigError
from posenc_cli.rope_scaling.frequencies import frequency_summary

__all__ = ["MAX_TARGET_LENGTH", "check_factor", "frequency_numbers"]

MAX_TARGET_LENGTH = 2**31 - 1  # tokens: the longest s·L an extension may target


def check_factor(method: str, factor: float, original_length: int) -> None:
    """Refuse a factor whose target length s·L is not a finite number of tokens below 2^31."""
    target = float(factor) * original_length
    if not math.isfinite(target) or target > MAX_TARGET_LENGTH:
        raise ConfigError(
            f"--factor {factor:g} is out of range for {method}: s·L = {target:.3g} tokens with L = {original_length} "
            f"(at most {MAX_TARGET_LENGTH:,}, so the factor at most {MAX_TARGET_LENGTH / original_length:.4g})"
        )


def frequency_numbers(
    method: str, rotary: int, base: float, factor: float, original_length: int, **params: Any
) -> tuple[float, dict[str, int], tuple[float, float]]:
    """`frequency_summary` (attention factor, regions, longest wavelength before/after) after `check_factor`, or a
    one-line ConfigError when the method's scaled frequencies are not finite and > 0 at this factor."""
    check_factor(method, factor, original_length)
    problem = f"--factor {factor:g} is out of range for {method}"
    if method == "longrope":
        problem = f"LongRoPE's factors (up to {max(_values(params)):g}) at --factor {factor:g} are out of range"
    try:
        attention, regions, wavelengths = frequency_summary(method, rotary, base, factor, original_length, **params)
    except (ZeroDivisionError, OverflowError) as e:
        raise ConfigError(f"{problem}: its frequencies cannot be computed ({e})") from None
    if not (math.isfinite(attention) and attention > 0 and all(math.isfinite(w) and w > 0 for w in wavelengths)):
        raise ConfigError(f"{problem}: a scaled frequency or the attention factor is not finite")
    return attention, regions, wavelengths


def _values(params: dict[str, Any]) -> list[float]:
    """Every LongRoPE factor in `params` (1 when none are given)."""
    out = [float(v) for key in ("short_factor", "long_factor") for v in (params.get(key) or [])]
    return out or [1.0]
