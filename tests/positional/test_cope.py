"""CoPE: positions are the cumulative gate sums (hand-built example), interpolation, and a per-token reference."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.config import ModelConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional import PositionContext
from posenc_cli.positional.cope import CoPE, CopeConfig, cope_bias, cope_gates, cope_positions, interpolate_logits
from posenc_cli.run.config_load import config_from_dict


def test_positions_are_cumulative_gate_sums_by_hand() -> None:
    gates = torch.tensor(
        [
            [1.0, 0.0, 0.0, 0.0],
            [0.5, 1.0, 0.0, 0.0],
            [1.0, 0.0, 0.5, 0.0],
            [0.5, 1.0, 0.25, 1.0],
        ]
    )[None, None]  # (1, 1, 4, 4), future gates already 0
    expected = torch.tensor(
        [
            [1.0, 0.0, 0.0, 0.0],
            [1.5, 1.0, 0.0, 0.0],
            [1.5, 0.5, 0.5, 0.0],
            [2.75, 2.25, 1.25, 1.0],  # p_3j = g_3j + ... + g_33
        ]
    )[None, None]
    torch.testing.assert_close(cope_positions(gates, max_pos=64), expected)
    torch.testing.assert_close(cope_positions(gates, max_pos=3), expected.clamp(max=2.0))  # clamped to max_pos − 1


def test_gates_are_sigmoid_of_scaled_scores_and_zero_for_future_keys() -> None:
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 1, 5, 4, generator=g)  # (B, H, T, d) each
    pos = torch.arange(5)
    gates = cope_gates(q, k, pos, pos)
    for i in range(5):
        for j in range(5):
            expected = 1 / (1 + math.exp(-(q[0, 0, i] @ k[0, 0, j]).item() / 2)) if j <= i else 0.0  # √4 = 2
            assert gates[0, 0, i, j].item() == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_interpolation_between_floor_and_ceil() -> None:
    logits = torch.tensor([10.0, 20.0, 40.0, 80.0])[None]  # (Tq = 1, P = 4): q·e[n]
    positions = torch.tensor([[0.0, 1.25, 2.5, 3.0, 0.9]], requires_grad=True)
    out = interpolate_logits(logits, positions)
    torch.testing.assert_close(out, torch.tensor([[10.0, 25.0, 60.0, 80.0, 19.0]]))
    out.sum().backward()  # d/dp = logit[⌊p⌋ + 1] − logit[⌊p⌋] (right derivative at integers; 0 at the top, P − 1)
    torch.testing.assert_close(positions.grad, torch.tensor([[10.0, 20.0, 40.0, 0.0, 10.0]]))


def naive_cope(q: torch.Tensor, k: torch.Tensor, emb: torch.Tensor, max_pos: int) -> torch.Tensor:
    """Token-by-token reference in float64: interpolate the embedding vectors, then dot with q (Eq. 4-5)."""
    B, H, T, d = q.shape
    q, k, emb = q.double(), k.double(), emb.double()
    out = torch.zeros(B, H, T, T, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                gates = [torch.sigmoid(q[b, h, i] @ k[b, h, t] / math.sqrt(d)).item() for t in range(i + 1)]
                for j in range(i + 1):
                    p = min(sum(gates[j : i + 1]), max_pos - 1)
                    lo, w = math.floor(p), p - math.floor(p)
                    e = (1 - w) * emb[lo] + w * emb[math.ceil(p)]
                    out[b, h, i, j] = q[b, h, i] @ e
    return out


def test_bias_equals_token_by_token_reference() -> None:
    g = torch.Generator().manual_seed(1)
    B, H, T, d, P = 2, 2, 9, 4, 5  # P < T: some positions are clamped
    q, k = torch.randn(2, B, H, T, d, generator=g) * 1.5
    emb = torch.randn(P, d, generator=g)
    pos = torch.arange(T)
    bias = cope_bias(q, k, emb, pos, pos, P)
    assert bias.shape == (B, H, T, T) and bias.dtype == torch.float32
    ref = naive_cope(q, k, emb, P).float()
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    torch.testing.assert_close(bias[..., causal], ref[..., causal], rtol=1e-4, atol=1e-5)


def test_query_chunk_equals_rows_of_the_full_bias() -> None:
    """The chunked attention path hands over queries [s, e) and keys [0, e): same values where j ≤ i."""
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 1, 2, 16, 8, generator=g)
    emb = torch.randn(8, 8, generator=g)
    pos = torch.arange(16)
    full = cope_bias(q, k, emb, pos, pos, 8)
    chunk = cope_bias(q[:, :, 5:11], k[:, :, :11], emb, pos[5:11], pos[:11], 8)
    causal = torch.ones(16, 16, dtype=torch.bool).tril()[5:11, :11]
    torch.testing.assert_close(chunk[..., causal], full[:, :, 5:11, :11][..., causal])


def test_fp32_under_bf16_autocast() -> None:
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 1, 2, 300, 8, generator=g)
    emb = torch.randn(64, 8, generator=g)
    pos = torch.arange(300)
    ref = cope_bias(q, k, emb, pos, pos, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = cope_bias(q, k, emb, pos, pos, 64)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref)


def test_scheme_parameters_per_layer_zero_init_and_gradients() -> None:
    scheme = CoPE(CopeConfig(max_pos=6), ModelConfig(d_model=16, n_head=2, n_layer=3), 16)
    assert scheme.pos_emb.shape == (3, 6, 8) and (scheme.pos_emb == 0).all()
    pos = torch.arange(10)
    ctx = PositionContext(positions=pos)
    q, k = torch.randn(2, 1, 2, 10, 8)
    assert (scheme.bias(0, q, k, pos, pos, ctx) == 0).all()  # zero init: starts as NoPE
    with torch.no_grad():
        scheme.pos_emb.normal_()
    q.requires_grad_(True)
    k.requires_grad_(True)
    scheme.bias(1, q, k, pos, pos, ctx).tril().square().sum().backward()
    grad = scheme.pos_emb.grad
    assert grad is not None and (grad[1] != 0).any() and (grad[0] == 0).all() and (grad[2] == 0).all()
    assert k.grad is not None and (k.grad != 0).any()  # gates learn through the interpolation weights


def test_config_validation() -> None:
    cfg = config_from_dict({"pos": {"name": "cope", "max_pos": 16}})
    assert isinstance(cfg.pos, CopeConfig) and cfg.pos.max_pos == 16
    with pytest.raises(ConfigError, match="max_pos"):
        config_from_dict({"pos": {"name": "cope", "max_pos": 1}})
