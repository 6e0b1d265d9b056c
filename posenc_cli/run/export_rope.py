"""RoPE in `transformers`' terms, for both export roads (GPT-NeoX in `run.export`, SmolLM3 in `run.export_smollm3`):
a RoPE run's rope parameters, base, partial rotary factor and length, and the row permutation that turns
interleaved rotary pairs into `transformers`' rotate_half pairs."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from posenc_cli.errors import NotExportable
from posenc_cli.positional.rope import rotary_dim
from posenc_cli.rope_scaling import get_method

if TYPE_CHECKING:
    from posenc_cli.positional.rope import RopeConfig

__all__ = ["interleaved_to_half", "neox_rope"]


def neox_rope(pos: RopeConfig, head_dim: int, train_length: int) -> tuple[dict[str, Any] | None, float, float, int]:
    """(rope_scaling or None, rope base, partial_rotary_factor, max_position_embeddings) of a RoPE run.

    `transformers` takes int(head_dim · partial_rotary_factor) rotary dims, so the factor is nudged up when the
    float quotient d/hd would truncate below d. L = the scaling's original length (default: training length).
    """
    d = rotary_dim(head_dim, pos.rotary_fraction)
    partial = d / head_dim
    while int(head_dim * partial) < d:
        partial = math.nextafter(partial, math.inf)
    s = pos.scaling
    if s.method == "none":
        return None, float(pos.base), partial, train_length
    hf = get_method(s.method).transformers(s.params, s.factor, s.original_length or train_length, d)
    if hf is None:  # a scaling method transformers has no rope type for
        raise NotExportable(f"not exportable: RoPE scaling '{s.method}' has no transformers rope type")
    base = float(pos.base * hf.theta_scale) if hf.theta_scale != 1.0 else float(pos.base)  # static NTK: new base
    scaling = None if hf.parameters["rope_type"] == "default" else hf.parameters
    return scaling, base, partial, hf.max_position_embeddings


def interleaved_to_half(rotary_dim: int) -> Tensor:
    """perm (d,) with new[j] = old[perm[j]]: the interleaved pair (2k, 2k+1) becomes the rotate_half pair (k, k+d/2).

    Applied to the rows of both q and k, it leaves every q·k dot product, and so attention, unchanged.
    """
    return torch.cat([torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2)])
