"""Sandwich: the bias equals the reference formula written out here, depends only on i − j, has no parameters."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.config import Config, ModelConfig, TrainConfig, config_to_dict
from posenc_cli.errors import ConfigError
from posenc_cli.positional import PositionContext
from posenc_cli.positional.sandwich import Sandwich, SandwichConfig, sandwich_profile
from posenc_cli.run.config_load import config_from_dict


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
    d = dim or d_model // n_head  # d' defaults to the per-head size (NeMo: hidden_size // num_attention_heads)
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
                assert bias[0, 0, r, c].item() == pytest.approx(
                    formula(i, j, 0, 2, 16), abs=2e-3
                )  # d_model 32 / 2 heads
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


def test_default_dim_is_the_head_size_as_in_nemo() -> None:
    """NeMo's `megatron/language_model.py` builds the Sandwich bias with `hidden_size // num_attention_heads`
    (Chi et al. 2023, arXiv:2212.10356, via NVIDIA NeMo `sandwich_relative_position_embedding.py`)."""
    tiny = ModelConfig(d_model=128, n_head=4, n_layer=4)
    assert Sandwich(SandwichConfig(), tiny, 128).dim == 32
    assert Sandwich(SandwichConfig(dim=64), tiny, 128).dim == 64
    # the old default (d' = d_model) penalised distance 1000 about 4.7x more strongly
    far = torch.tensor([1000])
    old, new = sandwich_profile(far, 128).item(), sandwich_profile(far, 32).item()
    assert old == pytest.approx(-53.4, abs=0.1) and new == pytest.approx(-11.5, abs=0.1)


def test_new_configs_record_the_head_size_explicitly() -> None:
    cfg = config_from_dict({"model": {"d_model": 64, "n_head": 4}, "pos": {"name": "sandwich"}})
    assert isinstance(cfg.pos, SandwichConfig) and cfg.pos.dim == 16  # resolved: config.yaml will say 16
    assert config_to_dict(cfg)["pos"]["dim"] == 16
    direct = Config(model=ModelConfig(d_model=64, n_head=4), pos=SandwichConfig(), train=TrainConfig())
    assert direct.pos.dim == 16  # also when built in code, not composed
    reloaded = config_from_dict(config_to_dict(cfg), saved=True)
    assert reloaded.pos.dim == 16  # a new run reloads with the value it was trained with


def test_runs_saved_before_the_change_keep_d_model() -> None:
    """config.yaml of a run saved before d' followed the head size holds `dim: null`, which meant d_model."""
    old = {"model": {"d_model": 64, "n_head": 4}, "pos": {"name": "sandwich", "dim": None, "base": 10000.0}}
    cfg = config_from_dict(old, saved=True)
    assert isinstance(cfg.pos, SandwichConfig) and cfg.pos.dim == 64
    scheme = Sandwich(cfg.pos, cfg.model, cfg.train.seq_len)
    assert scheme.dim == 64
    assert config_from_dict(old).pos.dim == 16  # composing (not loading a run) takes today's default
