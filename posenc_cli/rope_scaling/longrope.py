"""LongRoPE: per-pair rescale factors, one list for short and one for long sequences (Ding et al. 2024,
arXiv 2402.13753; transformers rope_type longrope, `_compute_longrope_parameters`).

inv_k' = inv_k / λ_k with λ = `long_factor` when the sequence is longer than L (seq_len > L, where seq_len is the
largest position id + 1, as `transformers` reads it per forward) and λ = `short_factor` otherwise (seq_len None or
<= L). Both lists have one factor per frequency pair (d/2 values); a list left unset is all ones (the pair keeps its
frequency). Attention factor on cos and sin, in both regimes: √(1 + ln s / ln L) for s > 1, 1 for s <= 1, unless
given. The paper *finds* λ by an evolutionary search (`posenc_cli/extension/longrope_search.py`, `extend --search`); its
n̂ (first positions kept un-interpolated) is not part of `transformers`' rope type and is left out here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from posenc_cli.errors import ConfigError
from posenc_cli.rope_scaling import ScalingMethod, ScalingParams, TransformersRope, param, register
from posenc_cli.untrusted import load_json

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "FACTOR_KEYS",
    "LongRoPE",
    "LongRopeParams",
    "check_factors",
    "factor_values",
    "longrope_attention_factor",
    "read_factors_file",
]

FACTOR_KEYS = ("short_factor", "long_factor")


@dataclass(frozen=True, kw_only=True)
class LongRopeParams(ScalingParams):
    short_factor: list[float] | None = param(  # noqa: RUF009 (a field() whose default is None)
        None,
        help="LongRoPE: factor of each frequency pair up to L tokens (repeat the flag d/2 times; default 1 each). "
        "Easier: --factors FILE.",
        metavar="λ",
    )
    long_factor: list[float] | None = param(  # noqa: RUF009 (a field() whose default is None)
        None,
        help="LongRoPE: factor of each frequency pair beyond L tokens (repeat the flag d/2 times; default 1 each). "
        "Easier: --factors FILE or --search.",
        metavar="λ",
    )
    attention_factor: float | None = param(
        None,
        help="YaRN, LongRoPE: factor on cos and sin (default: YaRN 0.1·ln s + 1, LongRoPE √(1 + ln s / ln L)).",
        metavar="F",
        positive=True,
    )  # shared with YaRN (same flag); LongRoPE's default is √(1 + ln s / ln L)


def check_factors(values: Sequence[float] | None, pairs: int, name: str) -> Tensor:
    """(pairs,) float64 factors: `values` checked (`factor_values`), or all ones when None."""
    import torch  # deferred: extend --help and config validation read this module without torch

    if values is None:
        return torch.ones(pairs, dtype=torch.float64)
    return torch.tensor(factor_values(values, pairs, name), dtype=torch.float64)


def factor_values(values: Sequence[float], pairs: int, name: str) -> list[float]:
    """`values` as floats, checked: a list of `pairs` (d/2) numbers, finite and > 0; one-line ConfigError else."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise ConfigError(f"LongRoPE {name} must be a list of numbers, got {values!r}")
    if len(values) != pairs:
        raise ConfigError(
            f"LongRoPE {name} has {len(values)} values; this RoPE has {pairs} frequency pairs "
            f"(rotary dim {2 * pairs}), one factor each"
        )
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise ConfigError(f"LongRoPE {name} must hold numbers only")
    out = [float(v) for v in values]
    if not all(math.isfinite(v) for v in out):
        raise ConfigError(f"LongRoPE {name} must be finite, got {next(v for v in out if not math.isfinite(v))}")
    if not all(v > 0 for v in out):
        raise ConfigError(f"LongRoPE {name} must be > 0, got {min(out)}")
    return out


def longrope_attention_factor(factor: float, original_length: int) -> float:
    """√(1 + ln s / ln L) for s > 1 (transformers' default when no attention factor is given), else 1."""
    if factor <= 1.0:
        return 1.0
    if original_length < 2:
        raise ConfigError(f"LongRoPE's attention factor needs an original length >= 2, got {original_length}")
    return math.sqrt(1.0 + math.log(factor) / math.log(original_length))


FACTORS_MAX_BYTES = 1 << 20  # a factors file holds d/2 numbers twice: kilobytes; a megabyte leaves room


def read_factors_file(path: Path | str) -> dict[str, list[float]]:
    """{"short_factor": [...], "long_factor": [...]} of a `--factors` file (other keys ignored), read through
    `posenc_cli.untrusted`: a regular file only (a FIFO or /dev/zero is refused, never read), at most
    `FACTORS_MAX_BYTES`, nested at most 4 deep, no integer of more digits than Python parses. One-line ConfigError
    naming the file for those and for lists that are missing, empty, of different lengths or not finite numbers
    > 0; the lengths are checked against the run's rotary dim later (`check_factors`), the factors' range at extend."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: the --factors file not found, cannot read it")
    raw = load_json(path, what="the --factors file", max_bytes=FACTORS_MAX_BYTES, max_depth=4)
    if not isinstance(raw, dict):
        raise ConfigError(f'--factors {path}: expected an object {{"short_factor": [...], "long_factor": [...]}}')
    out = {}
    for key in FACTOR_KEYS:
        if key not in raw:
            raise ConfigError(f"--factors {path}: missing '{key}'")
        values = raw[key]
        if not isinstance(values, list) or not values:
            raise ConfigError(f"--factors {path}: '{key}' must be a non-empty list of numbers")
        try:
            out[key] = factor_values(values, len(values), key)
        except ConfigError as e:
            raise ConfigError(f"--factors {path}: {e}") from None
        except OverflowError:  # an integer too large for a float (up to the ~4,300 digits JSON parses)
            raise ConfigError(f"--factors {path}: '{key}' holds a number too large for a float") from None
    if len(out["short_factor"]) != len(out["long_factor"]):
        raise ConfigError(
            f"--factors {path}: short_factor has {len(out['short_factor'])} values and long_factor "
            f"{len(out['long_factor'])}; both need one per frequency pair"
        )
    return out


@register
class LongRoPE(ScalingMethod):
    name = "longrope"
    title = "LongRoPE"
    summary = "per-pair factors (searched, or from --factors FILE), short below L and long beyond"
    paper = "Ding et al. 2024, arXiv:2402.13753"
    published = "2024-02-21"
    params_cls = LongRopeParams
    length_dependent = True  # short factors up to L tokens, long factors beyond
    rope_type = "longrope"

    def factors(self, p: LongRopeParams, head_dim: int, long: bool) -> Tensor:
        """(d/2,) float64 λ of one regime (both lists are checked either way)."""
        short = check_factors(p.short_factor, head_dim // 2, "short_factor")
        long_ = check_factors(p.long_factor, head_dim // 2, "long_factor")
        return long_ if long else short

    def inv_freq(
        self, p: LongRopeParams, head_dim: int, base: float, factor: float, original_length: int, seq_len: int | None
    ) -> Tensor:
        # deferred: extend --help and config validation read this module without torch
        from posenc_cli.rope_scaling.frequencies import base_inv_freq

        long = seq_len is not None and seq_len > original_length  # transformers: `if seq_len and seq_len > L`
        return base_inv_freq(head_dim, base) / self.factors(p, head_dim, long)

    def attention_factor(self, p: LongRopeParams, factor: float, original_length: int) -> float:
        if p.attention_factor is not None:  # used as given, whatever the factor (as in transformers)
            return p.attention_factor
        return longrope_attention_factor(factor, original_length)

    def regions(self, p: LongRopeParams, head_dim: int, base: float, factor: float, original_length: int) -> dict:
        """Of the long factors: λ = 1 → keep, λ >= s → interpolate (at least as much as PI), else blend."""
        long = self.factors(p, head_dim, True)
        keep, interpolate = int((long == 1.0).sum()), int((long >= factor).sum())
        return {"keep": keep, "blend": head_dim // 2 - keep - interpolate, "interpolate": interpolate}

    def transformers(self, p: LongRopeParams, factor: float, original_length: int, rotary_dim: int) -> TransformersRope:
        params = {"rope_type": "longrope", "factor": float(factor), "original_max_position_embeddings": original_length}
        for key in FACTOR_KEYS:
            params[key] = check_factors(getattr(p, key), rotary_dim // 2, key).tolist()
        if p.attention_factor is not None:
            params["attention_factor"] = float(p.attention_factor)
        return TransformersRope(params, 1.0, max(original_length, round(factor * original_length)))
