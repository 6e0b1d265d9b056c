"""NTK-aware (static): base' = base · s^(d/(d-2)), so pair 0 keeps its frequency and the last is divided by s.

bloc97 (2023); YaRN paper (Peng et al. 2023) Eq. 16. transformers has no rope type for it: it exports as plain RoPE
(rope_type default) with rope_theta = base'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posenc_cli.rope_scaling import ScalingMethod, ScalingParams, TransformersRope, register

if TYPE_CHECKING:
    from torch import Tensor


@register
class NTK(ScalingMethod):
    name = "ntk"
    title = "NTK-aware"
    summary = "NTK-aware static base change: base' = base·s^(d/(d-2))"
    paper = "bloc97 2023; Peng et al. 2023, arXiv:2309.00071 Eq. 16"
    published = "2023-06-29"
    min_rotary_dim = 4
    rope_type = "default"

    def inv_freq(
        self, p: ScalingParams, head_dim: int, base: float, factor: float, original_length: int, seq_len: int | None
    ) -> Tensor:
        # deferred: extend --help and config validation read this module without torch
        from posenc_cli.rope_scaling.frequencies import ntk_inv_freq

        return ntk_inv_freq(head_dim, base, factor)

    def regions(self, p: ScalingParams, head_dim: int, base: float, factor: float, original_length: int) -> dict:
        """inv_k' = inv_k · s^(-2k/(d-2)): pair 0 keeps, the last pair is exactly inv/s, the d/2 - 2 between blend."""
        return {"keep": 1, "blend": head_dim // 2 - 2, "interpolate": 1}

    def transformers(self, p: ScalingParams, factor: float, original_length: int, rotary_dim: int) -> TransformersRope:
        extended = max(original_length, round(factor * original_length))
        return TransformersRope({"rope_type": "default"}, factor ** (rotary_dim / (rotary_dim - 2)), extended)
