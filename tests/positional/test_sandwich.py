"""Sandwich: the bias equals the reference formula written out here, depends only on i − j, has no parameters."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.config import ModelConfig, config_from_dict
from posenc_cli.errors import ConfigError
from posenc_cli.positional import PositionContext
from posenc_cli.positional.sandwich import Sandwich, SandwichConfig


def formula(i: int, j: int, h: int, n_head: int, dim: int) -> float:
    """(Σ_{k=1}^{d'/2} cos((i − j)/10000^(2k/d')) − d'/2) / (h'·8/H), h' = h + 1, in float64."""
    s = sum(math.cos((i - j) / 10000 ** (2 * k / dim)) for k in range(1, dim // 2 + 1))
    return (s - dim / 2) / ((h + 1) * 8 / n_head)


def scheme_bias(n_head: int, d_model: int, q_pos: torch.Tensor, k_pos: torch.Tensor, **cfg: object) -> torch.Tensor:
    scheme = Sandwich(SandwichConfig(**cfg), ModelConfig(d_model=d_model, n_head=n_head, n_layer=1), 16)  # type: ignore[arg-type]
    positions = torch.arange(int(max(q_pos.max(), k_pos.max())) + 1)
    ctx = PositionContext(positions=positions)
    scheme.prepare(ctx)
    q = torch.zeros(1, n_head, q_pos.shape[0], d_model // n_head)
    bias = scheme.bias(0, q, q, q_pos, k_pos, ctx)
    assert bias is not None
    return bias


@pytest.mark.parametrize(("n_head", "d_model", "dim"), [(4, 32, None), (3, 24, 8), (8, 64, None)])
def test_bias_equals_the_formula(n_head: int, d_model: int, dim: int | None) -> None:
    T = 20
    bias = scheme_bias(n_head, d_model, torch.arange(T), torch.arange(T), dim=dim)
    assert bias.shape == (1, n_head, T, T) and bias.dtype == torch.float32
    d = dim or d_model  # d' defaults to the model's hidden size
    for h in range(n_head):
        for i in range(T):
            for j in range(i + 1):
                assert bias[0, h, i, j].item() == pytest.approx(formula(i, j, h, n_head, d), rel=1e-5, abs=1e-5)


def test_long_distances_and_shape_of_the_curve() -> None:
    q_pos, k_pos = torch.tensor([5000, 12000]), torch.arange(0, 12001, 1000)
    bias = scheme_bias(2, 32, q_pos, k_pos)
    for r, i in enumerate(q_pos.tolist()):
        for c, j in enumerate(k_pos.tolist()):
            if j <= i:
                assert bias[0, 0, r, c].item() == pytest.approx(formula(i, j, 0, 2, 32), abs=2e-3)
    near = scheme_bias(2, 32, torch.arange(30), torch.arange(30))[0, 0, 29]  # row of the last query
    assert near[29] == 0  # zero at distance 0 ...
    assert (near[:29] < 0).all()  # ... negative elsewhere


def test_depends_only_on_distance_and_matches_rows_of_the_full_bias() -> None:
    a = scheme_bias(4, 32, torch.arange(300, 310), torch.arange(290, 310))
    b = scheme_bias(4, 32, torch.arange(10, 20), torch.arange(0, 20))
    torch.testing.assert_close(a, b)
    full = scheme_bias(4, 32, torch.arange(40), torch.arange(40))
    chunk = scheme_bias(4, 32, torch.arange(24, 32), torch.arange(32))  # a query chunk as attention asks for it
    torch.testing.assert_close(chunk, full[:, :, 24:32, :32])


def test_parameter_free_and_head_scales() -> None:
    scheme = Sandwich(SandwichConfig(), ModelConfig(d_model=32, n_head=4), 16)
    assert scheme.state_dict() == {} and list(scheme.parameters()) == []
    bias = scheme_bias(4, 32, torch.arange(10), torch.arange(10))
    # head h' is the first head's bias divided by h': h'·8/H relative to 1·8/H
    for h in range(4):
        torch.testing.assert_close(bias[0, h] * (h + 1), bias[0, 0])


def test_config_validation() -> None:
    cfg = config_from_dict({"pos": {"name": "sandwich", "dim": 64}})
    assert isinstance(cfg.pos, SandwichConfig) and cfg.pos.dim == 64
    with pytest.raises(ConfigError, match="dim"):
        config_from_dict({"pos": {"name": "sandwich", "dim": 7}})
