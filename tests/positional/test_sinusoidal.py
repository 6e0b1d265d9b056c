"""Sinusoidal: values against the paper's formula (both variants) and the relative-shift rotation property."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.config import ModelConfig
from posenc_cli.model import GPT
from posenc_cli.positional import PositionContext
from posenc_cli.positional.sinusoidal import Sinusoidal, SinusoidalConfig, sinusoid_frequencies, sinusoid_table


def vaswani_reference(T: int, D: int) -> torch.Tensor:
    """PE(p, 2k) = sin(p / 10000^(2k/D)), PE(p, 2k+1) = cos(same) (Vaswani et al. §3.5), element by element."""
    pe = torch.zeros(T, D, dtype=torch.float64)
    for p in range(T):
        for k in range(D // 2):
            pe[p, 2 * k] = math.sin(p / 10000 ** (2 * k / D))
            pe[p, 2 * k + 1] = math.cos(p / 10000 ** (2 * k / D))
    return pe


def t2t_reference(T: int, D: int) -> torch.Tensor:
    """tensor2tensor/fairseq: ω_k = exp(−k·ln 10000/(D/2 − 1)), [sin(p·ω) ‖ cos(p·ω)]."""
    half = D // 2
    pe = torch.zeros(T, D, dtype=torch.float64)
    for p in range(T):
        for k in range(half):
            w = math.exp(-k * math.log(10000) / (half - 1))
            pe[p, k] = math.sin(p * w)
            pe[p, half + k] = math.cos(p * w)
    return pe


@pytest.mark.parametrize("D", [4, 16, 30])
def test_vaswani_values_match_formula(D: int) -> None:
    table = sinusoid_table(torch.arange(50), D, "vaswani")
    torch.testing.assert_close(table.double(), vaswani_reference(50, D), rtol=0, atol=2e-5)


@pytest.mark.parametrize("D", [4, 16, 30])
def test_t2t_values_match_formula(D: int) -> None:
    table = sinusoid_table(torch.arange(50), D, "t2t")
    torch.testing.assert_close(table.double(), t2t_reference(50, D), rtol=0, atol=2e-5)


def rotation(angle: float) -> torch.Tensor:
    """Maps (sin a, cos a) to (sin(a + angle), cos(a + angle))."""
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, s], [-s, c]], dtype=torch.float64)


@pytest.mark.parametrize("variant", ["vaswani", "t2t"])
@pytest.mark.parametrize("shift", [1, 5, 37])
def test_shift_is_a_fixed_block_rotation(variant: str, shift: int) -> None:
    """PE(p + k) = M_k·PE(p), M_k block-diagonal with 2x2 rotations by k·ω, the same for every p."""
    D = 16
    if variant == "vaswani":
        w = [10000 ** (-2 * k / D) for k in range(D // 2)]
    else:
        w = [math.exp(-k * math.log(10000) / (D // 2 - 1)) for k in range(D // 2)]
    blocks = [rotation(shift * x) for x in w]
    M = torch.block_diag(*blocks)  # acts on interleaved (sin, cos) pairs
    perm = (
        torch.arange(D)
        if variant == "vaswani"
        else torch.stack([torch.arange(D // 2), torch.arange(D // 2, D)], 1).flatten()
    )
    pe = sinusoid_table(torch.arange(200), D, variant).double()[:, perm]  # (T, D) as (sin, cos) pairs
    shifted = pe[shift:]
    predicted = pe[:-shift] @ M.T
    torch.testing.assert_close(predicted, shifted, rtol=0, atol=1e-4)


def test_embed_adds_scaled_table_to_token_embeddings() -> None:
    mc = ModelConfig(d_model=32, n_layer=1, n_head=2, init_std=0.02)
    model = GPT(mc, SinusoidalConfig(), 50, 16)
    idx = torch.randint(0, 50, (2, 40))
    ctx = model.context(idx)
    expected = model.wte(idx) + 0.02 * sinusoid_table(torch.arange(40), 32)
    torch.testing.assert_close(model.embed(idx, ctx), expected)


def test_explicit_scale_and_variant() -> None:
    scheme = Sinusoidal(SinusoidalConfig(variant="t2t", scale=1.0), ModelConfig(d_model=16, n_head=2), 8)
    ctx = PositionContext(positions=torch.arange(10))
    scheme.prepare(ctx)
    out = scheme.embed(torch.zeros(1, 10, 16), ctx)
    torch.testing.assert_close(out[0].double(), t2t_reference(10, 16), rtol=0, atol=2e-5)
    assert not list(scheme.parameters())  # nothing learned, nothing in checkpoints


def test_frequencies_span_one_to_inverse_base() -> None:
    for variant in ("vaswani", "t2t"):
        w = sinusoid_frequencies(64, variant)
        assert w[0] == 1.0 and torch.all(w[1:] < w[:-1])
    assert sinusoid_frequencies(64, "t2t")[-1].item() == pytest.approx(1e-4, rel=1e-5)  # exactly 1/10000 at k = D/2−1
