"""FIRE: the MLP input is ψ(i − j)/ψ(max(L, i)) (a min(L, i) copy fails here), the bias is f_θ of it, per layer."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.config import Config, ModelConfig, TrainConfig, config_to_dict
from posenc_cli.errors import ConfigError
from posenc_cli.positional import PositionContext
from posenc_cli.positional.fire import FIRE, Fire, FireConfig, fire_input, relu_mlp_piecewise
from posenc_cli.run.config_load import config_from_dict


def formula_input(i: int, j: int, c: float, L: float, normaliser: str = "max") -> float:
    """The paper's normalised distance, written out (ε = 1e-6 on the normaliser as in the paper's code)."""
    psi = lambda x: math.log(c * x + 1)  # noqa: E731
    return psi(i - j) / (psi(max(L, i) if normaliser == "max" else min(L, i)) + 1e-6)


def test_input_uses_max_of_threshold_and_query_position() -> None:
    c, L = 0.3, 8.0
    T = 30  # queries below and beyond the threshold
    u = fire_input(torch.arange(T), torch.arange(T), torch.tensor(c), torch.tensor(L))
    assert u.shape == (T, T) and u.dtype == torch.float32
    checked_beyond = 0
    for i in range(1, T):
        for j in range(i + 1):
            assert u[i, j].item() == pytest.approx(formula_input(i, j, c, L), rel=1e-5, abs=1e-7)
            if i > L and j < i:  # here a min(L, i) copy gives a different value
                assert u[i, j].item() != pytest.approx(formula_input(i, j, c, L, "min"), rel=1e-3)
                checked_beyond += 1
            if 0 < i < L and j < i:  # below the threshold: also different (normaliser ψ(L) vs ψ(i))
                assert u[i, j].item() != pytest.approx(formula_input(i, j, c, L, "min"), rel=1e-3)
    assert checked_beyond > 100
    assert (u.tril() <= 1 + 1e-6).all()  # causal distances i − j ≤ i, normalised by at least ψ(i)


def test_below_threshold_relative_beyond_progressive() -> None:
    c, L = torch.tensor(0.1), torch.tensor(512.0)
    near = fire_input(torch.arange(100, 110), torch.arange(90, 110), c, L)
    base = fire_input(torch.arange(10, 20), torch.arange(0, 20), c, L)
    torch.testing.assert_close(near, base)  # i < L: constant normaliser, only i − j matters
    far = fire_input(torch.arange(5000, 5010), torch.arange(4990, 5010), c, L)
    assert not torch.allclose(far, base)  # i > L: normalised by ψ(i)


def test_bias_is_the_mlp_of_the_input() -> None:
    torch.manual_seed(0)
    fire = Fire(n_head=3, width=32, init_c=0.1, init_L=16.0)
    pos = torch.arange(40)
    bias = fire(pos, pos)
    assert bias.shape == (1, 3, 40, 40)
    lin1, lin2 = fire.mlp[0], fire.mlp[2]
    w1, b1, w2, b2 = lin1.weight[:, 0].double(), lin1.bias.double(), lin2.weight.double(), lin2.bias.double()
    for i, j in [(0, 0), (10, 3), (39, 0), (39, 38), (20, 20)]:
        u = formula_input(i, j, 0.1, 16.0)
        hidden = torch.relu(u * w1 + b1)  # 1 → 32, ReLU
        expected = w2 @ hidden + b2  # 32 → H
        torch.testing.assert_close(bias[0, :, i, j].double(), expected.detach(), rtol=1e-5, atol=1e-6)


def test_piecewise_evaluation_equals_the_mlp_values_and_gradients() -> None:
    torch.manual_seed(3)
    mlp = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
    with torch.no_grad():
        mlp[0].weight[:3] = 0.0  # units that never switch: one always on, one off, one at exactly 0
        mlp[0].bias[:3] = torch.tensor([0.7, -0.2, 0.0])
    u = (torch.rand(40, 50) * 3 - 1).requires_grad_(True)  # inputs on both sides of every breakpoint
    g = torch.randn(40, 50, 5)
    ref = mlp(u[..., None])  # the oracle: torch's own Linear/ReLU/Linear
    (ref * g).sum().backward()
    ref_grads = [p.grad.clone() for p in mlp.parameters()]  # type: ignore[union-attr]
    ref_u = u.grad.clone()  # type: ignore[union-attr]
    mlp.zero_grad()
    u.grad = None
    out = relu_mlp_piecewise(u, mlp[0].weight[:, 0], mlp[0].bias, mlp[2].weight, mlp[2].bias)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-5, atol=1e-5)
    (out * g).sum().backward()
    for ours, theirs in zip((p.grad for p in mlp.parameters()), ref_grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(u.grad, ref_u, rtol=1e-5, atol=1e-5)


def test_initial_values_and_threshold() -> None:
    fire = Fire(n_head=2, width=32, init_c=0.1, init_L=512.0)
    assert fire.c.item() == pytest.approx(0.1) and fire.L_mult.item() == 1.0
    assert fire.threshold().item() == 512.0
    with torch.no_grad():
        fire.L_mult.fill_(-0.5)
    assert fire.threshold().item() == 256.0  # L = |L_mult·L0|


def test_per_layer_by_default_shared_on_request() -> None:
    mc = ModelConfig(d_model=32, n_head=2, n_layer=3)
    torch.manual_seed(0)
    per_layer = FIRE(FireConfig(), mc, 16)
    shared = FIRE(FireConfig(shared=True), mc, 16)
    assert len(per_layer.fires) == 3 and len(shared.fires) == 1
    pos = torch.arange(12)
    ctx = PositionContext(positions=pos)
    q = torch.zeros(1, 2, 12, 16)
    a, b = (per_layer.bias(layer, q, q, pos, pos, ctx) for layer in (0, 1))
    assert not torch.allclose(a, b)
    s0, s2 = (shared.bias(layer, q, q, pos, pos, ctx) for layer in (0, 2))
    assert torch.equal(s0, s2)


def test_every_parameter_gets_a_gradient() -> None:
    torch.manual_seed(0)
    fire = Fire(n_head=2, width=8, init_c=0.1, init_L=20.0)
    pos = torch.arange(40)  # queries on both sides of L = 20, so L_mult matters
    (fire(pos, pos).tril() ** 2).sum().backward()
    for name, param in fire.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
    assert fire.c.grad.item() != 0 and fire.L_mult.grad.item() != 0  # type: ignore[union-attr]


def test_config_validation() -> None:
    cfg = config_from_dict({"pos": {"name": "fire", "init_L": 64, "shared": True}})
    assert isinstance(cfg.pos, FireConfig) and cfg.pos.init_L == 64.0 and cfg.pos.shared
    with pytest.raises(ConfigError, match="init_c"):
        config_from_dict({"pos": {"name": "fire", "init_c": 0}})


def test_threshold_defaults_to_a_quarter_of_the_training_length() -> None:
    """FIRE (Li et al. 2023, arXiv:2310.04418): the paper's reference code initialises L0 = 512 for models trained
    at 2048 tokens, so posenc's default is L0 = L_train / 4 (32 at `train.seq_len=128`, where the old absolute 512
    made max(L, i) constant during training)."""
    mc = ModelConfig(d_model=32, n_head=2, n_layer=2)
    fire = FIRE(FireConfig(), mc, 128)
    assert [f.threshold().item() for f in fire.fires] == [32.0, 32.0]
    assert FIRE(FireConfig(), mc, 2048).fires[0].threshold().item() == 512.0  # the paper's setting
    assert FIRE(FireConfig(init_L=100.0), mc, 128).fires[0].threshold().item() == 100.0
    # inside the training window the normaliser now varies with the query position
    u = fire_input(torch.arange(128), torch.arange(128), torch.tensor(0.1), fire.fires[0].threshold())
    assert not torch.allclose(u[40, 30], u[100, 90])


def test_new_configs_record_the_threshold_and_old_runs_keep_512() -> None:
    cfg = config_from_dict({"pos": {"name": "fire"}, "train": {"seq_len": 64}})
    assert isinstance(cfg.pos, FireConfig) and cfg.pos.init_L == 16.0
    assert config_to_dict(cfg)["pos"]["init_L"] == 16.0  # written explicitly into config.yaml
    assert Config(pos=FireConfig(), train=TrainConfig(seq_len=256)).pos.init_L == 64.0
    # a run saved before the change: its config.yaml always held init_L (512.0 then); it loads unchanged
    old = {"pos": {"name": "fire", "mlp_width": 32, "init_c": 0.1, "init_L": 512.0, "shared": False}}
    loaded = config_from_dict(old, saved=True)
    assert loaded.pos.init_L == 512.0  # type: ignore[attr-defined]
    assert FIRE(loaded.pos, loaded.model, 128).fires[0].threshold().item() == 512.0  # type: ignore[arg-type]
    # a saved config without a value (hand-written) means the pre-change default, not today's
    assert config_from_dict({"pos": {"name": "fire", "init_L": None}}, saved=True).pos.init_L == 512.0  # type: ignore[attr-defined]
