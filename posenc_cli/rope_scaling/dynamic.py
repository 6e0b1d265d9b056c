"""Dynamic NTK: NTK-aware with a length-dependent factor, recomputed per sequence length.

base' = base · (s·n/L − (s − 1))^(d/(d−2)) with n = max(seq_len, L): plain RoPE up to L. emozilla (2023);
transformers: rope_type dynamic, factor s (it reads L from max_position_embeddings).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posenc_cli.rope_scaling import ScalingMethod, ScalingParams, TransformersRope, register

if TYPE_CHECKING:
    from torch import Tensor


@register
class Dynamic(ScalingMethod):
    name = "dynamic"
    title = "dynamic NTK"
    summary = "NTK-aware base change rescaled per sequence length (plain RoPE up to L)"
    paper = "emozilla 2023 (r/LocalLLaMA); transformers rope_type dynamic"
    published = "2023-06-30"
    min_rotary_dim = 4
    length_dependent = True
    rope_type = "dynamic"

    def inv_freq(
        self, p: ScalingParams, head_dim: int, base: float, factor: float, original_length: int, seq_len: int | None
    ) -> Tensor:
        """Plain RoPE when seq_len is None or <= L."""
        # deferred: extend --help and config validation read this module without torch
        from posenc_cli.rope_scaling.frequencies import ntk_inv_freq

        n = original_length if seq_len is None else max(seq_len, original_length)
        return ntk_inv_freq(head_dim, base, factor * n / original_length - (factor - 1))

    def regions(self, p: ScalingParams, head_dim: int, base: float, factor: float, original_length: int) -> dict:
        """Reported as NTK's split (it is NTK with a length-dependent factor; below L nothing changes)."""
        return {"keep": 1, "blend": head_dim // 2 - 2, "interpolate": 1}

    def transformers(self, p: ScalingParams, factor: float, original_length: int, rotary_dim: int) -> TransformersRope:
        return TransformersRope({"rope_type": "dynamic", "factor": float(factor)}, 1.0, original_length)
