"""Linear / position interpolation (PI): inv_k / s, the same as dividing positions by s.

Chen et al. 2023 (arXiv 2306.15595); kaiokendev (2023). transformers: rope_type linear, factor s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posenc_cli.rope_scaling import ScalingMethod, ScalingParams, TransformersRope, register

if TYPE_CHECKING:
    from torch import Tensor


@register
class Linear(ScalingMethod):
    name = "linear"
    title = "linear (PI)"
    summary = "position interpolation: every frequency divided by s"
    paper = "Chen et al. 2023, arXiv:2306.15595"
    published = "2023-06-27"
    rope_type = "linear"

    def inv_freq(
        self, p: ScalingParams, head_dim: int, base: float, factor: float, original_length: int, seq_len: int | None
    ) -> Tensor:
        # deferred: extend --help and config validation read this module without torch
        from posenc_cli.rope_scaling.frequencies import base_inv_freq

        return base_inv_freq(head_dim, base) / factor

    def regions(self, p: ScalingParams, head_dim: int, base: float, factor: float, original_length: int) -> dict:
        return {"keep": 0, "blend": 0, "interpolate": head_dim // 2}

    def transformers(self, p: ScalingParams, factor: float, original_length: int, rotary_dim: int) -> TransformersRope:
        extended = max(original_length, round(factor * original_length))
        return TransformersRope({"rope_type": "linear", "factor": float(factor)}, 1.0, extended)
