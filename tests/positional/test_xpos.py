"""xPos: ζ and the scale factors equal the paper's formula, q·k = Σ_k RoPE pair term · ζ_k^((i−j)/s), long lengths."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.config import ModelConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional import PositionContext
from posenc_cli.positional.xpos import XPos, XposConfig, xpos_scale, xpos_zeta
from posenc_cli.run.config_load import config_from_dict

LAYOUTS = ["rotate_half", "interleaved"]


def pairs(d: int, layout: str) -> list[tuple[int, int]]:
    """Index pairs (a, b) rotated together, pair k with frequency 10000^(−2k/d)."""
    if layout == "rotate_half":
        return [(k, k + d // 2) for k in range(d // 2)]
    return [(2 * k, 2 * k + 1) for k in range(d // 2)]


def reference_pair_terms(q: torch.Tensor, k: torch.Tensor, i: int, j: int, layout: str) -> torch.Tensor:
    """(d/2,) float64 RoPE contributions ⟨R(iθ_k)q_pair, R(jθ_k)k_pair⟩ written out with 2×2 rotations."""
    d = q.shape[-1]
    out = []
    for n, (a, b) in enumerate(pairs(d, layout)):
        theta = 10000.0 ** (-2 * n / d)

        def rot(x: torch.Tensor, p: int, a: int = a, b: int = b, theta: float = theta) -> tuple[float, float]:
            c, s = math.cos(p * theta), math.sin(p * theta)
            return c * x[a].item() - s * x[b].item(), s * x[a].item() + c * x[b].item()

        (q0, q1), (k0, k1) = rot(q, i), rot(k, j)
        out.append(q0 * k0 + q1 * k1)
    return torch.tensor(out, dtype=torch.float64)


def xpos_qk(scheme: XPos, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Place q and k (d,) at every position of one forward; return (T, T) dot products of the hooked vectors."""
    T = positions.shape[0]
    ctx = PositionContext(positions=positions)
    scheme.prepare(ctx)
    qs, ks = scheme.rotate(q.expand(1, 1, T, -1), k.expand(1, 1, T, -1), ctx)  # (1, 1, T, d)
    return (qs[0, 0].double() @ ks[0, 0].double().T).float()


def make(d: int = 16, **cfg: object) -> XPos:
    return XPos(XposConfig(**cfg), ModelConfig(d_model=d, n_head=1, n_layer=1), 16)  # type: ignore[arg-type]


def test_zeta_is_the_paper_formula() -> None:
    for d, gamma in [(16, 0.4), (64, 0.4), (8, 0.1)]:
        expected = [(2 * k / d + gamma) / (1 + gamma) for k in range(d // 2)]
        torch.testing.assert_close(xpos_zeta(d, gamma).double(), torch.tensor(expected, dtype=torch.float64))
    # torchscale writes the same thing as (arange(0, d, 2) + 0.4·d) / (1.4·d)
    torch.testing.assert_close(xpos_zeta(64), (torch.arange(0, 64, 2) + 0.4 * 64) / (1.4 * 64))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_scale_values_equal_the_formula(layout: str) -> None:
    d, s, center = 8, 512.0, 37.0
    zeta = xpos_zeta(d)
    positions = torch.tensor([0, 1, 37, 500, 4000])
    scale = xpos_scale(positions, zeta, s, center, layout)
    assert scale.shape == (5, d) and scale.dtype == torch.float32
    for r, p in enumerate(positions.tolist()):
        for n, (a, b) in enumerate(pairs(d, layout)):
            expected = zeta[n].double().item() ** ((p - center) / s)
            assert scale[r, a].item() == pytest.approx(expected, rel=1e-5)
            assert scale[r, b].item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dot_product_is_rope_times_pairwise_decay(layout: str) -> None:
    d, s = 16, 512.0
    scheme = make(d, layout=layout)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, d, generator=g)
    T = 300
    dots = xpos_qk(scheme, q, k, torch.arange(T))
    zeta = xpos_zeta(d).double()
    for i, j in [(0, 0), (5, 3), (299, 0), (150, 20), (299, 298)]:
        expected = (reference_pair_terms(q, k, i, j, layout) * zeta ** ((i - j) / s)).sum().item()
        assert dots[i, j].item() == pytest.approx(expected, rel=1e-4, abs=1e-4)


def test_dot_product_depends_only_on_offset() -> None:
    """The centre moves with the sequence (length, first position) but q_i·k_j only sees i − j."""
    scheme = make(16)
    q, k = torch.randn(2, 16, generator=torch.Generator().manual_seed(1))
    short = xpos_qk(scheme, q, k, torch.arange(40))
    long = xpos_qk(scheme, q, k, torch.arange(1000))
    shifted = xpos_qk(scheme, q, k, torch.arange(2000, 2040))
    for i, j in [(39, 0), (20, 7), (10, 10)]:
        assert long[i, j].item() == pytest.approx(short[i, j].item(), rel=1e-4, abs=1e-5)
        assert long[i + 900, j + 900].item() == pytest.approx(short[i, j].item(), rel=1e-3, abs=1e-4)
        assert shifted[i, j].item() == pytest.approx(short[i, j].item(), rel=1e-3, abs=1e-4)


@pytest.mark.parametrize("T", [16384, 65536])
def test_finite_at_long_lengths(T: int) -> None:
    """Uncentred, k's factor ζ_0^(−j/512) reaches e^160 at j = 65535 (fp32 overflows past e^88.7)."""
    d = 16
    scheme = make(d)
    ctx = PositionContext(positions=torch.arange(T))
    scheme.prepare(ctx)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 1, T, d, generator=g)
    qs, ks = scheme.rotate(x, x, ctx)
    assert torch.isfinite(qs).all() and torch.isfinite(ks).all()
    i, j = T - 1, T - 100  # a near pair at the end and a far pair across the whole sequence
    for a, b in [(i, j), (i, 0)]:
        expected = (
            reference_pair_terms(x[0, 0, a], x[0, 0, b], a, b, "rotate_half") * xpos_zeta(d).double() ** ((a - b) / 512)
        ).sum()
        got = (qs[0, 0, a].double() @ ks[0, 0, b].double()).item()
        assert got == pytest.approx(expected.item(), rel=2e-3, abs=1e-6)


def test_model_forward_and_no_parameters() -> None:
    from posenc_cli.model import GPT

    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=32, n_layer=2, n_head=2), XposConfig(), 48, 16).eval()
    assert model.scheme.state_dict() == {} and model.scheme.hooks == ("rotate",)
    with torch.no_grad():
        logits = model(torch.randint(0, 48, (1, 64)))
    assert torch.isfinite(logits).all()


def test_config_validation() -> None:
    cfg = config_from_dict({"pos": {"name": "xpos", "gamma": 0.2, "scale_base": 256, "layout": "interleaved"}})
    assert isinstance(cfg.pos, XposConfig) and cfg.pos.scale_base == 256.0
    with pytest.raises(ConfigError, match="gamma"):
        config_from_dict({"pos": {"name": "xpos", "gamma": 0}})
    with pytest.raises(ConfigError, match="scale_base"):
        config_from_dict({"pos": {"name": "xpos", "scale_base": -1}})
