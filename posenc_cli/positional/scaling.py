"""RoPE frequency scaling, public entry points: `scaled_inv_freq(method, head_dim, base, factor, original_length,
seq_len=None, **params) -> (inv_freq, attention_factor)` and its helpers, for parity checks outside posenc.

The methods themselves live in `posenc_cli.rope_scaling` (one file per method, a registry); posenc's own modules
import from there. This module is kept so that `posenc_cli.positional.scaling.scaled_inv_freq` stays importable.
It is not a scheme (`positional/__init__.py` skips it).
"""

from __future__ import annotations

from posenc_cli.rope_scaling import RopeScalingConfig, frequency_regions, scaled_inv_freq, scaled_inv_freq_for
from posenc_cli.rope_scaling.llama3 import llama3_wavelength_thresholds
from posenc_cli.rope_scaling.yarn import yarn_attention_factor, yarn_correction_range, yarn_ramp

__all__ = [
    "RopeScalingConfig",
    "frequency_regions",
    "llama3_wavelength_thresholds",
    "scaled_inv_freq",
    "scaled_inv_freq_for",
    "yarn_attention_factor",
    "yarn_correction_range",
    "yarn_ramp",
]
