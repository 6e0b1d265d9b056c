"""FoPE: Fourier Position Embedding (Hua et al., ICML 2025, arXiv 2412.17739, §4).

Each rotary pair of RoPE becomes a Fourier series over RoPE's frequencies, learned per layer and head, and the
frequencies too low to complete a period within the training length L are dropped ("clipped"). Defaults follow the
authors' code, yiju-zhao/Fourier-Position-Embedding@3713108 `olmo/model.py` (cited as :line), with the options its
shipped configs set (`configs/c4/length-512/ce-fourier/*.yaml`: `rope_clamp_floor_freq`, `rope_clamp_floor_to_zero`,
`fourier_separate_basis`, `fourier_separate_head`, `fourier_ignore_zero`, `fourier_init: eye_xavier_norm`):

- Frequencies: θ_k = base^(−2k/hd), k = 0..hd/2−1 (:488-490); those with θ_k < 2π·r/L are set to 0 (:352-358,
  :504-505; r = `pos.floor_ratio`, 1 in the code) and the zeros dropped (:560-561), leaving D_in kept frequencies
  θ_K. D_out = min(D_in, hd/4) (:753-756). hd = 64, L = 512: θ_0..θ_15 kept, D_in = D_out = 16.
- Mixing: per layer (one `FourierEmbedding` per block, :1119-1121) and head (:771-774), separate sine and cosine
  matrices A_s, A_c of shape (H, D_in, D_out) (:781-790):
  sin'_{h,t} = sin(t·θ_K)·A_s[h], cos'_{h,t} = cos(t·θ_K)·A_c[h] (:811-812), both padded to hd/2 with the
  constant 1 (:825-827), duplicated to hd and used as RoPE's cos and sin with rotate_half:
  x' = x·cos' + rotate_half(x)·sin' (:829-836), on q and k (:1285-1286).
- Init "eye_xavier_norm": xavier_normal(gain) + a strided identity, [i·⌈D_in/D_out⌉, i] = 1 (:841-851, :881-890);
  torch's fans for (H, D_in, D_out) are (D_in·D_out, H·D_out). Gain 0.3 (`olmo/config.py:434`; the code's configs
  use 0.3 / 0.4 / 0.6 for 60M / 180M / 1.2B).

A pad slot j (cos 1, sin 1) gives q'_j·k'_j + q'_{j+hd/2}·k'_{j+hd/2} = 2(q_j k_j + q_{j+hd/2} k_{j+hd/2}): no
position, but doubled. `pos.pad=identity` pads sin with 0 instead, leaving those channels untouched (the choice of a
later vLLM revision, `test_fope_leaves_unrotated_channels_untouched`).

Deviations, stated: (1) the coefficients are learned by default (`pos.learnable`, as posenc's issue #43 asks;
whether the paper's runs trained them is unconfirmed); the code's `fourier_learnable` defaults to False
(`olmo/config.py:449`) and no shipped config sets it, so `pos.learnable=false` reproduces the released recipe (the
coefficients then stay as drawn, kept in the checkpoint as persistent buffers). (2) Only the options the shipped
configs use are offered: separate bases and heads, zero-frequency dropping, eye_xavier_norm init, `fourier_dim` = hd,
no `fourier_norm`.

Scaling. The code extends FoPE with Position Interpolation and YaRN applied to the kept frequencies after the clip
(`len_extra_type: PI|YARN`, `len_extra_before_clamp: false`, :393-462, :550-555; `x+yarn` configs), so
`pos.scaling.method` takes `linear` (PI) or `yarn`; the others are refused in one line. The clip is decided on the
unscaled frequencies at the original length (`pos.scaling.original_length`, else the training length), so an
extended model keeps the checkpoint's D_in (the code clips at its `max_sequence_length`, :355, which would change
D_in, and with it the coefficients' shape, when a checkpoint is read at a longer length). The method's attention
factor multiplies cos' and sin', as for RoPE (`rope_scaling`); the code's YaRN has none, which
`pos.scaling.params.attention_factor=1` reproduces.

Not relative: cos'·cos' + sin'·sin' is no function of t_q − t_k once the coefficients mix frequencies, so a common
shift of the position ids changes the logits. Keys are turned by their own position alone, so a KV cache keeps them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional import register
from posenc_cli.positional.base import LayerView, PositionalScheme, PositionContext
from posenc_cli.positional.rope import apply_rope, rope_inv_freq
from posenc_cli.positional.span import FULL
from posenc_cli.rope_scaling import NONE, RopeScalingConfig, get_method
from posenc_cli.rope_scaling.frequencies import scaled_inv_freq

Pad = Literal["ones", "identity"]
SCALINGS = ("linear", "yarn")  # the code's PI and YaRN (olmo/model.py:393-462)


@dataclass(kw_only=True)
class FopeConfig(PosConfig):
    name: str = "fope"
    base: float = 10000.0
    floor_ratio: float = 1.0  # clip below 2π·floor_ratio/L (`rope_floor_freq_ratio`, olmo/config.py:374)
    init_gain: float = 0.3  # xavier gain of the coefficients (`fourier_init_norm_gain`, olmo/config.py:434)
    learnable: bool = True  # the code's `fourier_learnable` is False (olmo/config.py:449): see the module doc
    pad: Pad = "ones"  # pad slots' (cos, sin): (1, 1) as the code (olmo/model.py:825-827), or (1, 0) identity
    scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)

    def validate(self) -> None:
        if self.base <= 1:
            raise ConfigError(f"pos.base must be > 1, got {self.base}")
        if not self.floor_ratio >= 0:
            raise ConfigError(f"pos.floor_ratio must be >= 0, got {self.floor_ratio}")
        if not self.init_gain >= 0:
            raise ConfigError(f"pos.init_gain must be >= 0, got {self.init_gain}")
        if self.pad not in ("ones", "identity"):
            raise ConfigError(f"pos.pad must be ones or identity, got {self.pad!r}")
        method = self.scaling.method
        if method != NONE and method not in SCALINGS:
            raise ConfigError(
                f"pos=fope takes pos.scaling.method linear or yarn (the FoPE code's PI and YaRN), got {method}"
            )
        if method != NONE and self.scaling.factor < 1.0:
            raise ConfigError(f"pos.scaling.factor must be >= 1, got {self.scaling.factor}")


# ------------------------------------------------------------------------------------------------ pure maths


def kept_frequencies(head_dim: int, base: float, length: int, floor_ratio: float = 1.0) -> Tensor:
    """(hd/2,) bool: θ_k = base^(−2k/hd) ≥ 2π·floor_ratio/length, the frequencies FoPE keeps (olmo/model.py:355,
    :504-505, compared in fp32 as there)."""
    return ~(rope_inv_freq(head_dim, base) < 2 * math.pi / length * floor_ratio)


def fourier_dims(head_dim: int, kept: Tensor) -> tuple[int, int]:
    """(D_in, D_out): the kept frequencies and the mixed output slots, min(D_in, hd/4) (olmo/model.py:753-756)."""
    d_in = int(kept.sum())
    return d_in, min(d_in, head_dim // 4)


def strided_eye(d_in: int, d_out: int) -> Tensor:
    """(D_in, D_out) fp32: 1 at [i·⌈D_in/D_out⌉, i] (the identity when D_in = D_out; olmo/model.py:841-851)."""
    eye = torch.zeros(d_in, d_out)
    step = math.ceil(d_in / d_out)
    for i in range(d_out):
        if i * step < d_in:
            eye[i * step, i] = 1.0
    return eye


def init_coefficients(n_head: int, d_in: int, d_out: int, gain: float) -> Tensor:
    """(H, D_in, D_out) fp32 "eye_xavier_norm": xavier_normal(gain) + `strided_eye` (olmo/model.py:881-890)."""
    coef = torch.empty(n_head, d_in, d_out)
    nn.init.xavier_normal_(coef, gain=gain)  # fans (D_in·D_out, H·D_out)
    return coef + strided_eye(d_in, d_out)


def fourier_tables(
    basis_cos: Tensor, basis_sin: Tensor, cos_coef: Tensor, sin_coef: Tensor, head_dim: int, pad: Pad
) -> tuple[Tensor, Tensor]:
    """basis cos(t·θ_K), sin(t·θ_K) (T, D_in) or (B, T, D_in), coefficients (H, D_in, D_out) -> the tables
    `apply_rope` takes for rotate_half, (H, T, hd) or (B, H, T, hd) fp32: cos' = (c, c), sin' = (−s, s) with
    c, s the mixed series padded to hd/2 (the sign rotate_half gives the first half, folded in as in `rope_cos_sin`).
    Computed in fp32 with autocast off (the code's `rope_full_precision`)."""
    with torch.autocast(basis_cos.device.type, enabled=False):
        c = torch.einsum("...tk,hkj->...htj", basis_cos.float(), cos_coef.float())  # (..., H, T, D_out)
        s = torch.einsum("...tk,hkj->...htj", basis_sin.float(), sin_coef.float())
    n_pad = head_dim // 2 - c.shape[-1]
    c = nn.functional.pad(c, (0, n_pad), value=1.0)  # (..., H, T, hd/2)
    s = nn.functional.pad(s, (0, n_pad), value=1.0 if pad == "ones" else 0.0)
    return torch.cat([c, c], dim=-1), torch.cat([-s, s], dim=-1)  # (..., H, T, hd)


# ------------------------------------------------------------------------------------------------ the scheme


class FopeLayer(PositionalScheme):
    """One layer's coefficients A_c, A_s (H, D_in, D_out) and its rotation; the basis comes from `FoPE.prepare`.
    Not registered: `FoPE.layer_view` hands one to each layer."""

    name = "fope"
    config_cls = FopeConfig
    hooks = ("rotate",)
    paper = "Hua et al. 2024, arXiv:2412.17739"

    def __init__(self, cfg: FopeConfig, model: ModelConfig, train_length: int, d_in: int, d_out: int) -> None:
        super().__init__(cfg, model, train_length)
        cos_coef = init_coefficients(model.n_head, d_in, d_out, cfg.init_gain)
        sin_coef = init_coefficients(model.n_head, d_in, d_out, cfg.init_gain)
        if cfg.learnable:
            self.cos_coef, self.sin_coef = nn.Parameter(cos_coef), nn.Parameter(sin_coef)
        else:  # fixed as drawn, but part of the model: saved with it
            self.register_buffer("cos_coef", cos_coef)
            self.register_buffer("sin_coef", sin_coef)

    def tables(self, ctx: PositionContext, start: int = 0) -> tuple[Tensor, Tensor]:
        """This layer's (cos', sin') for the positions [start, T) of ctx, times the scaling's attention factor."""
        basis_cos, basis_sin, attn = ctx.tables["fope_basis"]  # (T, D_in) or (B, T, D_in) each
        if start:
            basis_cos, basis_sin = basis_cos[..., start:, :], basis_sin[..., start:, :]
        cos, sin = fourier_tables(basis_cos, basis_sin, self.cos_coef, self.sin_coef, self.head_dim, self.cfg.pad)
        return (cos * attn, sin * attn) if attn != 1.0 else (cos, sin)

    def rotate(self, q: Tensor, k: Tensor, ctx: PositionContext) -> tuple[Tensor, Tensor]:
        cos, sin = self.tables(ctx)  # (H, T, hd) or (B, H, T, hd)
        return apply_rope(q, cos, sin, "rotate_half"), apply_rope(k, cos, sin, "rotate_half")

    def rotate_rows(self, q: Tensor, k: Tensor, ctx: PositionContext, q_start: int) -> tuple[Tensor, Tensor]:
        cos, sin = self.tables(ctx)
        q_rows = cos[..., q_start:, :], sin[..., q_start:, :]  # the query rows' positions
        return apply_rope(q, *q_rows, "rotate_half"), apply_rope(k, cos, sin, "rotate_half")

    @property
    def fixed_key_rotation(self) -> bool:
        method = self.cfg.scaling.method
        return method == NONE or not get_method(method).length_dependent

    def rotate_new(self, q: Tensor, k: Tensor, ctx: PositionContext, q_start: int) -> tuple[Tensor, Tensor]:
        cos, sin = self.tables(ctx, q_start)  # the new tokens' positions only
        return apply_rope(q, cos, sin, "rotate_half"), apply_rope(k, cos, sin, "rotate_half")


@register
class FoPE(PositionalScheme):
    """FoPE (see the module doc): the clipped basis once per forward, each layer's own coefficients (`FopeLayer`).
    Its own hooks, for a caller that names no layer, are layer 0's."""

    name = "fope"
    config_cls = FopeConfig
    hooks = ("rotate",)
    paper = "Hua et al. 2024, arXiv:2412.17739"

    def __init__(self, cfg: FopeConfig, model: ModelConfig, train_length: int) -> None:
        super().__init__(cfg, model, train_length)
        if model.head_dim % 2 or model.head_dim < 4:  # D_out = min(D_in, hd/4) must be >= 1
            raise ConfigError(f"pos=fope needs an even head dim >= 4, got {model.head_dim}")
        self.clip_length = cfg.scaling.original_length or train_length  # the length the coefficients were fit at
        self.kept = kept_frequencies(model.head_dim, cfg.base, self.clip_length, cfg.floor_ratio)
        d_in, d_out = fourier_dims(model.head_dim, self.kept)
        if d_in == 0:
            raise ConfigError(
                f"pos=fope keeps no frequency: every θ_k < 2π·{cfg.floor_ratio:g}/{self.clip_length} "
                "(lower pos.floor_ratio or train longer)"
            )
        self.layers = nn.ModuleList(FopeLayer(cfg, model, train_length, d_in, d_out) for _ in range(model.n_layer))

    def frequencies(self, seq_len: int) -> tuple[Tensor, float]:
        """(θ_K (D_in,) fp32, attention factor): the kept frequencies, scaled by `pos.scaling` after the clip."""
        s = self.cfg.scaling
        if s.method == NONE:
            inv_freq, attn = rope_inv_freq(self.head_dim, self.cfg.base), 1.0
        else:
            inv_freq, attn = scaled_inv_freq(
                s.method, self.head_dim, self.cfg.base, s.factor, self.clip_length, seq_len=seq_len,
                **s.param_values(),
            )  # fmt: skip
        return inv_freq[self.kept], float(attn)

    def prepare(self, ctx: PositionContext) -> None:
        inv_freq, attn = self.frequencies(ctx.length)
        angles = ctx.positions.to(torch.float32)[..., None] * inv_freq.to(ctx.positions.device)  # (…, T, D_in)
        ctx.tables["fope_basis"] = (angles.cos(), angles.sin(), attn)

    def layer_view(self, layer: int, ctx: PositionContext) -> LayerView:
        return LayerView(self.layers[layer], ctx, FULL, None)

    def rotate(self, q: Tensor, k: Tensor, ctx: PositionContext) -> tuple[Tensor, Tensor]:
        return self.layers[0].rotate(q, k, ctx)

    def rotate_rows(self, q: Tensor, k: Tensor, ctx: PositionContext, q_start: int) -> tuple[Tensor, Tensor]:
        return self.layers[0].rotate_rows(q, k, ctx, q_start)

    @property
    def fixed_key_rotation(self) -> bool:
        return self.layers[0].fixed_key_rotation

    def rotate_new(self, q: Tensor, k: Tensor, ctx: PositionContext, q_start: int) -> tuple[Tensor, Tensor]:
        return self.layers[0].rotate_new(q, k, ctx, q_start)
