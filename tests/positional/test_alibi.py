"""ALiBi: fairseq's slopes for every head count 1..64, the reference sheet's values, and the bias −m·(i − j)."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.config import ModelConfig
from posenc_cli.positional import PositionContext
from posenc_cli.positional.alibi import ALiBi, AlibiConfig, alibi_bias, alibi_slopes


def fairseq_slopes(n: int) -> list[float]:
    """The reference formula: geometric sequence from 2^(−8/n) for powers of two; otherwise the closest power of
    two c, then every other slope of 2c heads for the remaining n − c."""

    def power_of_two(m: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start * start**i for i in range(m)]

    if math.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_two(closest) + fairseq_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("n_head", range(1, 65))
def test_slopes_equal_fairseq_formula(n_head: int) -> None:
    ours = alibi_slopes(n_head)
    assert ours.shape == (n_head,)
    torch.testing.assert_close(
        ours.double(), torch.tensor(fairseq_slopes(n_head), dtype=torch.float64), rtol=1e-6, atol=0
    )


def test_slopes_reference_sheet_values() -> None:
    eight = [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
    torch.testing.assert_close(alibi_slopes(8).double(), torch.tensor(eight, dtype=torch.float64))
    twelve = [*eight, 0.7071068, 0.3535534, 0.1767767, 0.0883883]
    torch.testing.assert_close(alibi_slopes(12).double(), torch.tensor(twelve, dtype=torch.float64), rtol=1e-6, atol=0)
    six = [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
    torch.testing.assert_close(alibi_slopes(6).double(), torch.tensor(six, dtype=torch.float64))


def test_bias_is_minus_slope_times_distance() -> None:
    H, T = 4, 9
    slopes = alibi_slopes(H)
    b = alibi_bias(slopes, torch.arange(T), torch.arange(T))
    assert b.shape == (1, H, T, T)
    for h in range(H):
        for i in range(T):
            for j in range(i + 1):
                assert b[0, h, i, j].item() == pytest.approx(-slopes[h].item() * (i - j))


def test_bias_depends_only_on_distance_and_uses_positions() -> None:
    slopes = alibi_slopes(8)
    a = alibi_bias(slopes, torch.arange(100, 110), torch.arange(90, 110))
    b = alibi_bias(slopes, torch.arange(10, 20), torch.arange(0, 20))
    torch.testing.assert_close(a, b)


def test_scheme_hook_and_no_state() -> None:
    scheme = ALiBi(AlibiConfig(), ModelConfig(d_model=48, n_head=6), 16)
    assert scheme.has_bias and scheme.state_dict() == {}
    ctx = PositionContext(positions=torch.arange(5))
    scheme.prepare(ctx)
    q = torch.zeros(1, 6, 5, 8)
    bias = scheme.bias(0, q, q, ctx.positions, ctx.positions, ctx)
    assert bias is not None
    torch.testing.assert_close(bias[0, :, 4, 0], -4 * torch.tensor(fairseq_slopes(6), dtype=torch.float32))


def test_slopes_stay_exact_when_model_is_cast_to_bf16() -> None:
    from posenc_cli.model import GPT

    model = GPT(ModelConfig(d_model=48, n_layer=1, n_head=12), AlibiConfig(), 32, 16).to(torch.bfloat16)
    ctx = model.context(torch.randint(0, 32, (1, 8)))
    assert ctx.tables["alibi_slopes"].dtype == torch.float32
    torch.testing.assert_close(ctx.tables["alibi_slopes"], alibi_slopes(12))


def test_key_bias_differs_from_the_bias_by_a_per_query_constant() -> None:
    """Causal rows: bias[h, i, j] − key_bias[h, j] must not depend on j ≤ i (softmax rows then agree)."""
    from posenc_cli.positional.alibi import alibi_key_bias

    H, T = 8, 50
    slopes, pos = alibi_slopes(H), torch.arange(T) + 7  # shifted positions: nothing may assume they start at 0
    diff = alibi_bias(slopes, pos, pos)[0] - alibi_key_bias(slopes, pos)[:, None, :]  # (H, T, T)
    for i in range(T):
        row = diff[:, i, : i + 1]  # keys j ≤ i
        torch.testing.assert_close(row, row[:, :1].expand_as(row), rtol=0, atol=1e-4)
    torch.testing.assert_close(diff[:, :, 0], -slopes[:, None] * pos[None, :].float())  # the constant is −m_h·i


def test_scheme_offers_the_key_bias_and_shares_its_bias() -> None:
    scheme = ALiBi(AlibiConfig(), ModelConfig(d_model=64, n_head=4), 16)
    ctx = PositionContext(positions=torch.arange(10))
    scheme.prepare(ctx)
    kb = scheme.key_bias(ctx.positions, ctx)
    assert kb is not None and kb.shape == (4, 10) and kb.dtype == torch.float32
    assert scheme.bias_shared_across_layers
