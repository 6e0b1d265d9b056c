"""RoPE: relative-position property, norm preservation, layout equivalence, and HF Llama as an oracle."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from posenc_cli.config import ModelConfig
from posenc_cli.errors import ConfigError
from posenc_cli.model import GPT
from posenc_cli.positional import PositionContext
from posenc_cli.positional import rope as rope_mod
from posenc_cli.positional.rope import (
    RoPE,
    RopeConfig,
    apply_rope,
    rope_cos_sin,
    rope_inv_freq,
)
from posenc_cli.rope_scaling import RopeScalingConfig
from posenc_cli.rope_scaling.yarn import YarnParams

LAYOUTS = ["rotate_half", "interleaved"]


def rotate_at(x: torch.Tensor, position: int, layout: str, base: float = 10000.0) -> torch.Tensor:
    """Rotate vector(s) x (..., d) as if they sat at `position`."""
    cos, sin = rope_cos_sin(torch.tensor([position]), rope_inv_freq(x.shape[-1], base), layout)
    return apply_rope(x[..., None, :], cos, sin, layout)[..., 0, :]


@pytest.mark.parametrize("layout", LAYOUTS)
@settings(max_examples=40, deadline=None)
@given(
    half=st.integers(1, 32),
    m=st.integers(0, 1000),
    n=st.integers(0, 1000),
    shift=st.integers(-500, 500),
    seed=st.integers(0, 2**16),
)
def test_dot_product_depends_only_on_offset(layout: str, half: int, m: int, n: int, shift: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 2 * half, generator=g)
    m2, n2 = m + shift, n + shift
    if min(m2, n2) < 0:
        m2, n2 = m - shift, n - shift
    a = rotate_at(q, m, layout) @ rotate_at(k, n, layout)
    b = rotate_at(q, m2, layout) @ rotate_at(k, n2, layout)
    tol = 2e-4 * q.norm() * k.norm() * (1 + max(m, n, m2, n2) / 100)
    assert abs(a - b) <= tol


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rotation_preserves_norm_and_is_identity_at_zero(layout: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 50, 16)  # (B, H, T, hd)
    cos, sin = rope_cos_sin(torch.arange(50), rope_inv_freq(16), layout)
    y = apply_rope(x, cos, sin, layout)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y[:, :, 0], x[:, :, 0])  # position 0: no rotation
    assert not torch.allclose(y[:, :, 1:], x[:, :, 1:])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rotation_angle_of_each_pair(layout: str) -> None:
    """Pair k is rotated by p·base^(−2k/d): check against the 2x2 rotation written out."""
    d, p = 8, 7
    x = torch.randn(d)
    y = rotate_at(x, p, layout)
    pairs = (
        [(k, k + d // 2) for k in range(d // 2)]
        if layout == "rotate_half"
        else [(2 * k, 2 * k + 1) for k in range(d // 2)]
    )
    for k, (a, b) in enumerate(pairs):
        theta = torch.tensor(p * 10000.0 ** (-2 * k / d))
        c, s = torch.cos(theta), torch.sin(theta)
        torch.testing.assert_close(y[a], c * x[a] - s * x[b])
        torch.testing.assert_close(y[b], s * x[a] + c * x[b])


def test_layouts_agree_after_row_permutation() -> None:
    d, T = 16, 40
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])  # interleaved pair (2k, 2k+1) -> (k, k+d/2)
    x = torch.randn(2, 3, T, d)
    cos_i, sin_i = rope_cos_sin(torch.arange(T), rope_inv_freq(d), "interleaved")
    cos_h, sin_h = rope_cos_sin(torch.arange(T), rope_inv_freq(d), "rotate_half")
    y_int = apply_rope(x, cos_i, sin_i, "interleaved")
    y_half = apply_rope(x[..., perm], cos_h, sin_h, "rotate_half")
    torch.testing.assert_close(y_half, y_int[..., perm])


def test_models_with_either_layout_agree_after_permuting_qk_rows() -> None:
    """A model trained with one layout is the other layout's model with q/k projection rows permuted per head."""
    mc = ModelConfig(d_model=32, n_layer=2, n_head=2)
    hd = mc.head_dim
    torch.manual_seed(0)
    m_int = GPT(mc, RopeConfig(layout="interleaved"), 64, 32)
    m_half = GPT(mc, RopeConfig(layout="rotate_half"), 64, 32)
    state = m_int.state_dict()
    perm_head = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])
    perm_qk = torch.cat([h * hd + perm_head for h in range(mc.n_head)])  # within each head
    rows = torch.cat([perm_qk, mc.d_model + perm_qk, torch.arange(2 * mc.d_model, 3 * mc.d_model)])  # q, k; v kept
    for key in list(state):
        if key.endswith("attn.qkv.weight") or key.endswith("attn.qkv.bias"):
            state[key] = state[key][rows]
    m_half.load_state_dict(state)
    idx = torch.randint(0, 64, (2, 24))
    torch.testing.assert_close(m_half(idx), m_int(idx), rtol=1e-4, atol=1e-5)


def test_rotate_half_matches_hf_llama() -> None:
    B, H, T, hd, base = 2, 4, 33, 32, 10000.0
    torch.manual_seed(1)
    q, k = torch.randn(B, H, T, hd), torch.randn(B, H, T, hd)
    # cos/sin built as HF Llama does (LlamaRotaryEmbedding.forward) from the default inverse frequencies.
    inv_freq = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    position_ids = torch.arange(T)[None].expand(B, T)
    freqs = position_ids[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())

    scheme = RoPE(RopeConfig(base=base), ModelConfig(d_model=H * hd, n_head=H), train_length=T)
    ctx = PositionContext(positions=torch.arange(T))
    scheme.prepare(ctx)
    q_ours, k_ours = scheme.rotate(q, k, ctx)
    torch.testing.assert_close(q_ours, q_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_ours, k_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_partial_rotary_rotates_leading_dims_only(layout: str) -> None:
    hd, T = 16, 20
    scheme = RoPE(RopeConfig(rotary_fraction=0.5, layout=layout), ModelConfig(d_model=2 * hd, n_head=2), 32)
    assert scheme.rotary_dim == 8
    ctx = PositionContext(positions=torch.arange(T))
    scheme.prepare(ctx)
    q = torch.randn(1, 2, T, hd)
    q_rot, _ = scheme.rotate(q, q, ctx)
    torch.testing.assert_close(q_rot[..., 8:], q[..., 8:])
    cos, sin = rope_cos_sin(torch.arange(T), rope_inv_freq(8), layout)  # RoPE of an 8-dim head
    torch.testing.assert_close(q_rot[..., :8], apply_rope(q[..., :8], cos, sin, layout))


def test_odd_rotary_dim_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="even"):
        RoPE(RopeConfig(rotary_fraction=0.3), ModelConfig(d_model=32, n_head=2), 32)  # 0.3·16 = 4.8 -> 5


def test_bf16_autocast_keeps_dtype_and_fp32_angles() -> None:
    scheme = RoPE(RopeConfig(), ModelConfig(d_model=32, n_head=2), 32)
    ctx = PositionContext(positions=torch.arange(4096))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scheme.prepare(ctx)
        q = torch.randn(1, 2, 4096, 16, dtype=torch.bfloat16)
        q_rot, _ = scheme.rotate(q, q, ctx)
    assert ctx.tables["rope_cos"].dtype == torch.float32
    assert q_rot.dtype == torch.bfloat16


def test_scaling_none_never_calls_scaled_inv_freq(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("scaled_inv_freq called for method none")

    monkeypatch.setattr(rope_mod, "scaled_inv_freq", boom)
    model = GPT(ModelConfig(d_model=32, n_layer=1, n_head=2), RopeConfig(), 32, 16)
    model(torch.randint(0, 32, (1, 40)))


def test_scaling_uses_scaled_frequencies_and_attention_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a scaling method, cos/sin come from scaled_inv_freq's frequencies times its attention factor."""
    calls = []

    def fake(method, head_dim, base, factor, original_length, seq_len=None, **params):  # type: ignore[no-untyped-def]
        calls.append((method, head_dim, base, factor, original_length, seq_len, params))
        return rope_inv_freq(head_dim, base) / factor, 1.25

    monkeypatch.setattr(rope_mod, "scaled_inv_freq", fake)
    cfg = RopeConfig(scaling=RopeScalingConfig(method="yarn", factor=4.0, params=YarnParams(beta_fast=16.0)))
    scheme = RoPE(cfg, ModelConfig(d_model=32, n_head=2), train_length=64)
    ctx = PositionContext(positions=torch.arange(100))
    scheme.prepare(ctx)
    method, head_dim, base, factor, original, seq_len, params = calls[0]
    assert (method, head_dim, base, factor, original, seq_len) == ("yarn", 16, 10000.0, 4.0, 64, 100)
    assert params["beta_fast"] == 16.0 and params["truncate"] is True
    cos, sin = rope_cos_sin(torch.arange(100), rope_inv_freq(16) / 4.0, "rotate_half")
    torch.testing.assert_close(ctx.tables["rope_cos"], 1.25 * cos)
    torch.testing.assert_close(ctx.tables["rope_sin"], 1.25 * sin)


def test_frequencies_stay_fp32_when_model_is_cast_to_bf16() -> None:
    model = GPT(ModelConfig(d_model=32, n_layer=1, n_head=2), RopeConfig(), 32, 16).to(torch.bfloat16)
    ctx = model.context(torch.randint(0, 32, (1, 300)))
    cos, _ = rope_cos_sin(torch.arange(300), rope_inv_freq(16), "rotate_half")
    torch.testing.assert_close(ctx.tables["rope_cos"], cos)
