"""KERPLE: log and power kernels equal their formulas, depend only on i − j, keep p and a in range, train."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.config import ModelConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional import PositionContext
from posenc_cli.positional.kerple import Kerple, KerpleConfig, kerple_kernel, kerple_params
from posenc_cli.run.config_load import config_from_dict


def kerple(variant: str, p: list[float], a: list[float], n_layer: int = 1) -> Kerple:
    """A scheme with the given (in-range) parameters."""
    mc = ModelConfig(d_model=4 * len(p), n_head=len(p), n_layer=n_layer)
    scheme = Kerple(KerpleConfig(variant=variant), mc, 16)  # type: ignore[arg-type]
    with torch.no_grad():
        scheme.p.copy_(torch.tensor(p))
        scheme.a.copy_(torch.tensor(a))
    return scheme


def bias_of(scheme: Kerple, q_pos: torch.Tensor, k_pos: torch.Tensor, layer: int = 0) -> torch.Tensor:
    ctx = PositionContext(positions=torch.arange(int(max(q_pos.max(), k_pos.max())) + 1))
    scheme.prepare(ctx)
    q = torch.zeros(1, scheme.n_head, q_pos.shape[0], 4)
    bias = scheme.bias(layer, q, q, q_pos, k_pos, ctx)
    assert bias is not None
    return bias


@pytest.mark.parametrize(
    ("variant", "p", "a", "formula"),
    [
        ("log", [0.5, 1.0, 1.7], [0.02, 0.3, 1.0], lambda p, a, n: -p * math.log(1 + a * n)),
        ("power", [0.3, 1.0, 2.0], [0.05, 0.5, 1.2], lambda p, a, n: -a * n**p),
    ],
)
def test_bias_equals_the_kernel_formula(variant: str, p: list[float], a: list[float], formula: object) -> None:
    T = 12
    b = bias_of(kerple(variant, p, a), torch.arange(T), torch.arange(T))
    assert b.shape == (1, 3, T, T) and b.dtype == torch.float32
    for h in range(3):
        for i in range(T):
            for j in range(i + 1):
                expected = formula(p[h], a[h], i - j)  # type: ignore[operator]
                assert b[0, h, i, j].item() == pytest.approx(expected, rel=1e-6, abs=1e-7)
    n = torch.tensor([0, 1, 7, 5000])
    table = kerple_kernel(variant, torch.tensor(p), torch.tensor(a), n)  # type: ignore[arg-type]
    assert table.shape == (4, 3)
    for h in range(3):
        for r, d in enumerate(n.tolist()):
            assert table[r, h].item() == pytest.approx(formula(p[h], a[h], d), rel=1e-5)  # type: ignore[operator]


@pytest.mark.parametrize("variant", ["log", "power"])
def test_bias_depends_only_on_distance(variant: str) -> None:
    scheme = kerple(variant, [0.7, 1.9], [0.1, 0.8])
    far = bias_of(scheme, torch.arange(1000, 1010), torch.arange(990, 1010))
    near = bias_of(scheme, torch.arange(10, 20), torch.arange(0, 20))
    torch.testing.assert_close(far, near)


def test_parameters_are_clamped_into_range() -> None:
    p, a = torch.tensor([-1.0, 0.001, 0.5, 3.0]), torch.tensor([-0.2, 0.005, 0.4, 5.0])
    lp, la = kerple_params(p, a, "log")
    assert lp.tolist() == pytest.approx([0.01, 0.01, 0.5, 3.0]) and la.tolist() == pytest.approx([0.01, 0.01, 0.4, 5.0])
    pp, pa = kerple_params(p, a, "power")
    assert pp.tolist() == pytest.approx([0.01, 0.01, 0.5, 2.0]) and pa.tolist() == pytest.approx(la.tolist())


def test_scheme_uses_the_clamped_values() -> None:
    b = bias_of(kerple("power", [-1.0, 3.0], [0.5, -2.0]), torch.arange(5), torch.arange(5))
    assert b[0, 0, 4, 0].item() == pytest.approx(-0.5 * 4**0.01, rel=1e-6)  # p clamped up to 0.01
    assert b[0, 1, 4, 0].item() == pytest.approx(-0.01 * 4**2.0, rel=1e-6)  # p down to 2, a up to 0.01


def test_reference_initialisation_and_one_set_for_all_layers() -> None:
    torch.manual_seed(0)
    scheme = Kerple(KerpleConfig(), ModelConfig(d_model=64, n_head=64, n_layer=3), 16)
    assert sorted(scheme.state_dict()) == ["a", "p"]
    p, a = scheme.p.detach(), scheme.a.detach()
    assert p.shape == a.shape == (64,)
    assert p.min() >= 0 and p.max() <= 2 and p.max() > 1  # U(0, 2)
    assert a.min() >= 0 and a.max() <= 1  # U(0, 1)
    ctx = PositionContext(positions=torch.arange(20))
    scheme.prepare(ctx)
    q = torch.zeros(1, 64, 20, 1)
    b0, b2 = (scheme.bias(layer, q, q, ctx.positions, ctx.positions, ctx) for layer in (0, 2))
    assert torch.equal(b0, b2)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_gradients_are_finite_including_distance_zero(variant: str) -> None:
    scheme = Kerple(KerpleConfig(variant=variant), ModelConfig(d_model=16, n_head=4, n_layer=1), 16)  # type: ignore[arg-type]
    ctx = PositionContext(positions=torch.arange(16))
    scheme.prepare(ctx)
    q = torch.zeros(1, 4, 16, 4)
    scheme.bias(0, q, q, ctx.positions, ctx.positions, ctx).sum().backward()
    for param in (scheme.p, scheme.a):
        assert param.grad is not None and torch.isfinite(param.grad).all() and (param.grad != 0).all()


def test_config_variant_is_checked() -> None:
    cfg = config_from_dict({"pos": {"name": "kerple", "variant": "power"}})
    assert isinstance(cfg.pos, KerpleConfig) and cfg.pos.variant == "power"
    with pytest.raises(ConfigError, match="variant"):
        config_from_dict({"pos": {"name": "kerple", "variant": "cubic"}})
