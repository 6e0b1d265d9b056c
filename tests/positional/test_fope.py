"""FoPE against a direct re-implementation of the authors' formula (olmo/model.py of
yiju-zhao/Fourier-Position-Embedding@3713108, written out step by step below), its frequencies and clip, init,
pads, per-layer coefficients, the scalings it takes and the ones it refuses."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from posenc_cli.config import ModelConfig
from posenc_cli.errors import ConfigError
from posenc_cli.model import GPT
from posenc_cli.positional import PositionContext
from posenc_cli.positional.fope import (
    FoPE,
    FopeConfig,
    fourier_dims,
    init_coefficients,
    kept_frequencies,
    strided_eye,
)
from posenc_cli.positional.rope import RoPE, RopeConfig
from posenc_cli.rope_scaling import RopeScalingConfig, get_method

STUB = ModelConfig(d_model=128, n_layer=2, n_head=2)  # head dim 64, as the sheet's worked example


# -- the reference, written out --------------------------------------------------------------------------------------


def reference_frequencies(head_dim: int, base: float, length: int) -> torch.Tensor:
    """The code's get_inv_freq with the shipped options: θ, clip below 2π/L to 0, zeros dropped. θ is computed in
    float64 and rounded (the code's fp32 power is within an ulp of it: `test_kept_frequencies_are_the_references`)."""
    inv = (1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))).float()
    inv[inv < 2 * torch.pi / length] = 0.0
    return inv[inv != 0.0]


def reference_fope(
    x: torch.Tensor, seq: torch.Tensor, inv_freq: torch.Tensor, sin_coef: torch.Tensor, cos_coef: torch.Tensor
) -> torch.Tensor:
    """x (B, H, T, hd) -> FourierEmbedding.apply_rotary_pos_emb: basis (1, 1, T, D_in), einsum bhtD,hDd, pad with 1
    to hd/2, duplicate, x·cos + rotate_half(x)·sin."""
    hd = x.shape[-1]
    freqs = torch.einsum("t, hd -> htd", seq.float(), inv_freq[None, :])  # (1, T, D_in)
    positions = freqs.unsqueeze(0)  # (1, 1, T, D_in)
    pos_sin, pos_cos = positions.sin(), positions.cos()
    f_sin = torch.einsum("bhtD, hDd -> bhtd", pos_sin, sin_coef)
    f_cos = torch.einsum("bhtD, hDd -> bhtd", pos_cos, cos_coef)
    f_sin = torch.nn.functional.pad(f_sin, (0, hd // 2 - f_sin.size(-1)), value=1)
    f_cos = torch.nn.functional.pad(f_cos, (0, hd // 2 - f_cos.size(-1)), value=1)
    f_sin, f_cos = torch.cat((f_sin, f_sin), dim=-1), torch.cat((f_cos, f_cos), dim=-1)
    x1, x2 = x.unflatten(-1, (2, hd // 2)).unbind(dim=-2)
    return x * f_cos + torch.cat((-x2, x1), dim=-1) * f_sin


def reference_yarn(inv_freq: torch.Tensor, head_dim: int, base: float, orig: int, scale: float) -> torch.Tensor:
    """The code's extra_yarn(inv_freq) on the clipped (not yet dropped) table, β_fast 32, β_slow 1, factor 1."""

    def correction_dim(rot: float) -> float:
        return head_dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(correction_dim(32)), 0), min(math.ceil(correction_dim(1)), head_dim - 1)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    mask = 1 - ramp
    return (inv_freq / scale) * (1 - mask) + inv_freq * mask


def rotate_layer(scheme: FoPE, layer: int, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
    ctx = PositionContext(positions=positions)
    scheme.prepare(ctx)
    view = scheme.layer_view(layer, ctx)
    return view.scheme.rotate(q, k, view.ctx)


def qk(T: int, seed: int = 0, model: ModelConfig = STUB) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, model.n_head, T, model.head_dim, generator=g) for _ in range(2))


# -- frequencies, dims, init -----------------------------------------------------------------------------------------


def test_the_sheets_worked_example_keeps_sixteen_frequencies() -> None:
    """hd 64, L 512: θ_0..θ_15 ≥ 2π/512, D_in = D_out = 16 (olmo/model.py:753-756)."""
    kept = kept_frequencies(64, 10000.0, 512)
    assert kept.nonzero().flatten().tolist() == list(range(16))
    assert fourier_dims(64, kept) == (16, 16)
    assert fourier_dims(64, kept_frequencies(64, 10000.0, 2048)) == (21, 16)  # D_out = hd/4 < D_in


@pytest.mark.parametrize("length", [512, 2048])
def test_kept_frequencies_are_the_references(length: int) -> None:
    scheme = FoPE(FopeConfig(), STUB, length)
    inv, attn = scheme.frequencies(length)
    torch.testing.assert_close(inv, reference_frequencies(64, 10000.0, length), rtol=0, atol=0)
    assert attn == 1.0
    code = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float) / 64))  # the code's fp32 power
    torch.testing.assert_close(inv, code[: inv.shape[0]], rtol=2.5e-7, atol=0)
    assert (code[inv.shape[0] :] < 2 * torch.pi / length).all()


def test_strided_eye_and_init() -> None:
    assert torch.equal(strided_eye(4, 4), torch.eye(4))
    assert strided_eye(5, 2).nonzero().tolist() == [[0, 0], [3, 1]]  # step ⌈5/2⌉ = 3
    torch.manual_seed(0)
    assert torch.equal(init_coefficients(3, 5, 2, gain=0.0), strided_eye(5, 2).expand(3, 5, 2))
    noise = init_coefficients(64, 16, 16, gain=0.3) - torch.eye(16)
    expected = 0.3 * math.sqrt(2 / (16 * 16 + 64 * 16))  # torch's fans of (H, D_in, D_out)
    assert noise.std().item() == pytest.approx(expected, rel=0.05)


# -- the formula -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [512, 2048])  # D_in = D_out, and D_in > D_out (strided init)
def test_rotation_equals_the_reference_formula_on_every_layer(length: int) -> None:
    torch.manual_seed(0)
    scheme = FoPE(FopeConfig(), STUB, length)
    T = 40
    positions = torch.arange(T) * 37  # far apart: every kept frequency turns
    q, k = qk(T)
    inv = reference_frequencies(64, 10000.0, length)
    for layer in range(STUB.n_layer):
        coefs = scheme.layers[layer]
        got_q, got_k = rotate_layer(scheme, layer, q, k, positions)
        for x, got in ((q, got_q), (k, got_k)):
            want = reference_fope(x, positions, inv, coefs.sin_coef.detach(), coefs.cos_coef.detach())
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_layers_have_their_own_coefficients() -> None:
    """One FourierEmbedding per block (olmo/model.py:1119-1121): two layers rotate the same q differently."""
    torch.manual_seed(0)
    scheme = FoPE(FopeConfig(), STUB, 512)
    q, k = qk(8)
    a, _ = rotate_layer(scheme, 0, q, k, torch.arange(8))
    b, _ = rotate_layer(scheme, 1, q, k, torch.arange(8))
    assert not torch.allclose(a, b)
    assert len(list(scheme.parameters())) == 2 * STUB.n_layer


def test_identity_coefficients_with_identity_pads_are_rope_on_the_kept_frequencies() -> None:
    """A_s = A_c = I, pads (cos 1, sin 0): RoPE with the 16 lowest frequencies of 32 zeroed (p-RoPE, p = 1/2)."""
    scheme = FoPE(FopeConfig(pad="identity"), STUB, 512)
    with torch.no_grad():
        for layer in scheme.layers:
            layer.sin_coef.copy_(torch.eye(16))
            layer.cos_coef.copy_(torch.eye(16))
    rope = RoPE(RopeConfig(p=0.5), STUB, 512)
    T = 24
    q, k = qk(T)
    ctx = PositionContext(positions=torch.arange(T) * 11)
    rope.prepare(ctx)
    for got, want in zip(rotate_layer(scheme, 1, q, k, ctx.positions), rope.rotate(q, k, ctx), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_ones_pads_double_the_pad_channels_and_identity_pads_leave_them() -> None:
    """Pad slot j with (cos, sin) = (1, 1): q'_j·k'_j + q'_{j+32}·k'_{j+32} = 2(q_j k_j + q_{j+32} k_{j+32})."""
    q, k = qk(6)
    pads = [j for j in range(64) if j % 32 >= 16]
    for pad, factor in (("ones", 2.0), ("identity", 1.0)):
        scheme = FoPE(FopeConfig(pad=pad), STUB, 512)
        rq, rk = rotate_layer(scheme, 0, q, k, torch.arange(6))
        got = (rq[..., pads] * rk[..., pads]).sum(-1)
        torch.testing.assert_close(got, factor * (q[..., pads] * k[..., pads]).sum(-1), rtol=1e-5, atol=1e-5)
        if pad == "identity":
            assert torch.equal(rq[..., pads], q[..., pads])


def test_a_common_shift_of_the_positions_changes_the_scores() -> None:
    """Mixed frequencies are not a function of i − j: FoPE is not relative (and equal A_s = A_c made it so)."""
    torch.manual_seed(0)
    scheme = FoPE(FopeConfig(), STUB, 512)
    assert not scheme.relative
    q, k = qk(10)
    scores = []
    for shift in (0, 5):
        rq, rk = rotate_layer(scheme, 0, q, k, torch.arange(10) + shift)
        scores.append(rq @ rk.transpose(-1, -2))
    assert (scores[0] - scores[1]).abs().max() > 0.1


# -- options ---------------------------------------------------------------------------------------------------------


def test_fixed_coefficients_are_saved_buffers() -> None:
    scheme = FoPE(FopeConfig(learnable=False), STUB, 512)
    assert list(scheme.parameters()) == []
    assert sorted(scheme.state_dict()) == [f"layers.{i}.{c}" for i in range(2) for c in ("cos_coef", "sin_coef")]


def test_yarn_and_pi_scale_the_kept_frequencies_after_the_clip() -> None:
    """The code's `len_extra` after the clamp (olmo/model.py:550-555): YaRN's ramp over all hd/2 pairs, then the
    clipped ones dropped; PI divides by s. The clip stays at the original length, so D_in does not change."""
    clipped = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float) / 64))
    clipped[clipped < 2 * torch.pi / 512] = 0.0
    for method, want in (
        ("yarn", reference_yarn(clipped, 64, 10000.0, 512, 16.0)),
        ("linear", clipped / 16.0),
    ):
        scaling = RopeScalingConfig(method=method, factor=16.0, original_length=512)
        scheme = FoPE(FopeConfig(scaling=scaling), STUB, 1024)
        inv, attn = scheme.frequencies(8192)
        torch.testing.assert_close(inv, want[want != 0], rtol=1e-6, atol=0)
        assert attn == pytest.approx(0.1 * math.log(16) + 1 if method == "yarn" else 1.0)
    scaled = FoPE(FopeConfig(scaling=RopeScalingConfig(method="yarn", factor=16.0)), STUB, 512)
    assert scaled.layers[0].cos_coef.shape == (2, 16, 16)


def test_the_attention_factor_multiplies_the_tables() -> None:
    torch.manual_seed(0)
    plain = FoPE(FopeConfig(), STUB, 512)
    scaling = RopeScalingConfig(method="yarn", factor=4.0)
    scaling.params = dataclasses.replace(scaling.params, attention_factor=1.5)
    scaled = FoPE(FopeConfig(scaling=scaling), STUB, 512)
    scaled.load_state_dict(plain.state_dict())
    q, k = qk(5)
    ctx = PositionContext(positions=torch.arange(5))
    scaled.prepare(ctx)
    basis_cos, basis_sin, attn = ctx.tables["fope_basis"]
    assert attn == 1.5
    got, _ = scaled.rotate(q, k, ctx)
    ctx.tables["fope_basis"] = (basis_cos, basis_sin, 1.0)
    unscaled, _ = scaled.rotate(q, k, ctx)
    torch.testing.assert_close(got, 1.5 * unscaled)


@pytest.mark.parametrize("method", ["ntk", "dynamic", "llama3", "longrope"])
def test_scalings_the_reference_does_not_apply_are_refused(method: str) -> None:
    get_method(method)  # a real method, refused for FoPE only
    with pytest.raises(ConfigError, match="pos=fope takes pos.scaling.method linear or yarn"):
        FopeConfig(scaling=RopeScalingConfig(method=method, factor=2.0)).validate()


def test_a_training_length_that_keeps_no_frequency_is_refused() -> None:
    with pytest.raises(ConfigError, match="keeps no frequency"):
        FoPE(FopeConfig(), STUB, 4)  # 2π/4 > θ_0 = 1
    for d_model in (4, 6):  # head dims 2 (no output slot: hd/4 = 0) and 3
        with pytest.raises(ConfigError, match="even head dim >= 4"):
            FoPE(FopeConfig(), ModelConfig(d_model=d_model, n_layer=1, n_head=2), 512)


def test_bad_options_are_refused() -> None:
    for cfg in (FopeConfig(base=1.0), FopeConfig(floor_ratio=-1.0), FopeConfig(pad="zeros")):  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            cfg.validate()


def test_a_model_trains_with_fope_through_the_registry() -> None:
    """`pos=fope` builds through the registry; a gradient reaches every layer's coefficients."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=64, n_layer=2, n_head=2), FopeConfig(), 32, 64)  # hd 32, L 64: D_in 5, D_out 5
    assert isinstance(model.scheme, FoPE) and model.scheme.layers[0].cos_coef.shape == (2, 5, 5)
    idx = torch.randint(0, 32, (2, 17))
    loss = torch.nn.functional.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    for layer in model.scheme.layers:
        assert layer.cos_coef.grad.abs().sum() > 0 and layer.sin_coef.grad.abs().sum() > 0
