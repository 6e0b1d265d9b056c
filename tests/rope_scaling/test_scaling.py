"""RoPE frequency scaling: parity with `transformers`' `_compute_*_parameters` and the reference sheet's numbers."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from posenc_cli.config import ModelConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional.rope import RoPE, RopeConfig
from posenc_cli.rope_scaling import RopeScalingConfig, get_method
from posenc_cli.rope_scaling.frequencies import frequency_regions, scaled_inv_freq
from posenc_cli.rope_scaling.yarn import YarnParams, yarn_attention_factor, yarn_correction_range, yarn_ramp

HEAD_DIMS = (16, 32, 64, 128)
ORIGINAL_LENGTHS = (64, 128, 256, 4096)
FACTORS = (1.5, 2.0, 4.0, 8.0, 16.0)
BASES = (10000.0, 500000.0)
RTOL = 1e-6


@pytest.fixture(scope="module")
def hf():
    """(LlamaConfig, ROPE_INIT_FUNCTIONS) from transformers, the test-only oracle."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    transformers.logging.set_verbosity_error()
    return transformers.LlamaConfig, ROPE_INIT_FUNCTIONS


def hf_config(hf, rope_type: str, head_dim: int, base: float, max_len: int, **scaling):
    """A transformers LlamaConfig with RoPE scaling.

    Built with the legacy `rope_scaling` + `rope_theta` keywords, which transformers 5.x converts to
    `rope_parameters` and 4.x reads directly. `max_len` is `max_position_embeddings`: the original length for
    `dynamic` (which reads L there), s·L for yarn/llama3 so no version can infer a different factor from it.
    """
    return hf[0](
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_len,
        rope_theta=base,
        rope_scaling={"rope_type": rope_type, **scaling},
    )


def hf_call(hf, config, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """transformers' (inv_freq, attention_factor) for `config`."""
    inv_freq, attention = hf[1][config.rope_parameters["rope_type"]](config, None, seq_len=seq_len)
    return inv_freq, float(attention)


def hf_rope(hf, rope_type: str, head_dim: int, base: float, max_len: int, **scaling) -> tuple[torch.Tensor, float]:
    return hf_call(hf, hf_config(hf, rope_type, head_dim, base, max_len, **scaling))


def assert_inv_close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert ours.dtype == torch.float32, what
    assert ours.shape == ref.shape, what
    torch.testing.assert_close(ours.double(), ref.double(), rtol=RTOL, atol=0.0, msg=lambda m: f"{what}: {m}")


def plain_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    """base^(-2k/d), written independently of the module (float64)."""
    return torch.tensor([base ** (-2 * k / head_dim) for k in range(head_dim // 2)], dtype=torch.float64)


# ----------------------------------------------------------------------------------------------- transformers parity

GRID = list(itertools.product(ORIGINAL_LENGTHS, FACTORS))


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_linear_matches_transformers(hf, head_dim: int, base: float) -> None:
    for length, factor in GRID:
        ref, ref_attn = hf_rope(hf, "linear", head_dim, base, length, factor=factor)
        inv, attn = scaled_inv_freq("linear", head_dim, base, factor, length)
        assert_inv_close(inv, ref, f"linear L={length} s={factor}")
        assert attn == ref_attn == 1.0


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_dynamic_matches_transformers(hf, head_dim: int, base: float) -> None:
    for length, factor in GRID:
        config = hf_config(hf, "dynamic", head_dim, base, length, factor=factor)
        for seq_len in (None, length // 2, length, length + 1, 3 * length):
            ref, ref_attn = hf_call(hf, config, seq_len)
            inv, attn = scaled_inv_freq("dynamic", head_dim, base, factor, length, seq_len)
            assert_inv_close(inv, ref, f"dynamic L={length} s={factor} n={seq_len}")
            assert attn == ref_attn == 1.0


@pytest.mark.parametrize("truncate", [True, False])
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_yarn_matches_transformers(hf, head_dim: int, base: float, truncate: bool) -> None:
    for length, factor in GRID:
        scaling = {"factor": factor, "original_max_position_embeddings": length, "truncate": truncate}
        ref, ref_attn = hf_rope(hf, "yarn", head_dim, base, int(factor * length), **scaling)
        inv, attn = scaled_inv_freq("yarn", head_dim, base, factor, length, truncate=truncate)
        assert_inv_close(inv, ref, f"yarn L={length} s={factor} truncate={truncate}")
        assert attn == pytest.approx(ref_attn, rel=1e-12, abs=0.0)


@pytest.mark.parametrize(
    ("params", "scaling"),
    [
        ({"attention_factor": 0.8}, {"attention_factor": 0.8}),
        ({"attention_factor": 1.5, "truncate": False}, {"attention_factor": 1.5, "truncate": False}),
        ({"beta_fast": 16.0, "beta_slow": 2.0}, {"beta_fast": 16.0, "beta_slow": 2.0}),
        ({"mscale": 1.0, "mscale_all_dim": 1.0}, {"mscale": 1.0, "mscale_all_dim": 1.0}),  # DeepSeek-V3: factor 1
        ({"mscale": 0.707, "mscale_all_dim": 1.0}, {"mscale": 0.707, "mscale_all_dim": 1.0}),
        ({"mscale": 1.0, "mscale_all_dim": 0.707}, {"mscale": 1.0, "mscale_all_dim": 0.707}),
        ({"mscale": 0.707}, {"mscale": 0.707}),  # one alone: the default 0.1·ln s + 1
        ({"mscale_all_dim": 0.707}, {"mscale_all_dim": 0.707}),
        ({"mscale": 2.0, "mscale_all_dim": 1.0, "attention_factor": 1.2},
         {"mscale": 2.0, "mscale_all_dim": 1.0, "attention_factor": 1.2}),  # a given factor wins
    ],
)  # fmt: skip
def test_yarn_params_match_transformers(hf, params: dict, scaling: dict) -> None:
    for head_dim, length, factor in [(64, 256, 4.0), (32, 4096, 16.0), (128, 64, 1.5)]:
        ref, ref_attn = hf_rope(
            hf, "yarn", head_dim, 10000.0, int(factor * length), factor=factor,
            original_max_position_embeddings=length, **scaling,
        )  # fmt: skip
        inv, attn = scaled_inv_freq("yarn", head_dim, 10000.0, factor, length, **params)
        assert_inv_close(inv, ref, f"yarn {params} d={head_dim} L={length}")
        assert attn == pytest.approx(ref_attn, rel=1e-12, abs=0.0)


def test_yarn_mscale_worked_values() -> None:
    """The sheet's DeepSeek numbers, s = 40: m = m' = 1 gives 1; m = 0.707, m' = 1 gives 0.921042."""
    assert yarn_attention_factor(40.0, 1.0, 1.0) == 1.0
    assert yarn_attention_factor(40.0, 0.707, 1.0) == pytest.approx(0.921042, abs=1e-6)
    assert yarn_attention_factor(40.0, 0.707, None) == yarn_attention_factor(40.0) == pytest.approx(1.368888, abs=1e-6)
    assert yarn_attention_factor(1.0, 0.707, 1.0) == 1.0


@pytest.mark.parametrize(
    "params",
    [{"mscale": 0.707, "mscale_all_dim": 1.0}, {"mscale": 1.0, "mscale_all_dim": 0.5}, {"mscale": 0.707}, {}],
)
def test_yarn_exported_parameters_read_back_by_transformers(hf, params: dict) -> None:
    """What export and `extend HF_DIR` write (`YaRN.transformers`), read by transformers: posenc's frequencies and
    attention factor, mscale keys included."""
    method = get_method("yarn")
    for head_dim, length, factor in [(64, 256, 4.0), (128, 4096, 40.0)]:
        exported = method.transformers(YarnParams(**params), factor, length, head_dim)
        for key in ("mscale", "mscale_all_dim"):
            assert exported.parameters.get(key) == params.get(key)
        config = hf[0](
            hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim, rope_theta=10000.0,
            max_position_embeddings=exported.max_position_embeddings, rope_scaling=exported.parameters,
        )  # fmt: skip
        ref, ref_attn = hf_call(hf, config)
        inv, attn = scaled_inv_freq("yarn", head_dim, 10000.0, factor, length, **params)
        assert_inv_close(inv, ref, f"yarn export {params} d={head_dim} L={length}")
        assert attn == pytest.approx(ref_attn, rel=1e-12, abs=0.0)


@pytest.mark.parametrize(
    ("head_dim", "length", "truncate"),
    [
        (16, 6, True),  # low = high = 0 after clamping -> the +0.001 rule
        (32, 2, True),  # both corrections negative: high clamps below low
        (16, 10**9, False),  # high clamps to d - 1
        (16, 10**9, True),
    ],
)
def test_yarn_edge_ranges_match_transformers(hf, head_dim: int, length: int, truncate: bool) -> None:
    scaling = {"factor": 4.0, "original_max_position_embeddings": length, "truncate": truncate}
    ref, _ = hf_rope(hf, "yarn", head_dim, 10000.0, 4 * length, **scaling)
    inv, _ = scaled_inv_freq("yarn", head_dim, 10000.0, 4.0, length, truncate=truncate)
    assert_inv_close(inv, ref, f"yarn edge d={head_dim} L={length}")


def test_yarn_plus_0001_rule_is_exercised() -> None:
    low, high = yarn_correction_range(16, 10000.0, 6)
    assert low == high == 0.0
    ramp = yarn_ramp(16, 10000.0, 6)
    assert ramp[0] == 0.0 and bool((ramp[1:] == 1.0).all())
    assert yarn_correction_range(16, 10000.0, 10**9, truncate=False)[1] == 15.0


@pytest.mark.parametrize("low_high", [(1.0, 4.0), (2.0, 8.0)])
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_llama3_matches_transformers(hf, head_dim: int, base: float, low_high: tuple[float, float]) -> None:
    low, high = low_high
    for length, factor in GRID:
        ref, ref_attn = hf_rope(
            hf, "llama3", head_dim, base, int(factor * length), factor=factor,
            original_max_position_embeddings=length, low_freq_factor=low, high_freq_factor=high,
        )  # fmt: skip
        inv, attn = scaled_inv_freq(
            "llama3", head_dim, base, factor, length, low_freq_factor=low, high_freq_factor=high
        )
        assert_inv_close(inv, ref, f"llama3 L={length} s={factor} low={low} high={high}")
        assert attn == ref_attn == 1.0


@pytest.mark.parametrize("method", ["yarn", "llama3"])
def test_regions_match_transformers_frequencies(hf, method: str) -> None:
    """keep/blend/interpolate counts agree with where transformers' frequencies equal inv_k, inv_k/s or neither."""
    for head_dim, length, factor, base in itertools.product(HEAD_DIMS, ORIGINAL_LENGTHS, (2.0, 8.0), BASES):
        ref, _ = hf_rope(
            hf, method, head_dim, base, int(factor * length), factor=factor, original_max_position_embeddings=length,
            **({"low_freq_factor": 1.0, "high_freq_factor": 4.0} if method == "llama3" else {}),
        )  # fmt: skip
        plain = plain_inv_freq(head_dim, base)
        ref = ref.double()
        keep = torch.isclose(ref, plain, rtol=RTOL, atol=0.0)
        interpolate = torch.isclose(ref, plain / factor, rtol=RTOL, atol=0.0)
        expected = {
            "keep": int(keep.sum()),
            "blend": int((~keep & ~interpolate).sum()),
            "interpolate": int(interpolate.sum()),
        }
        assert frequency_regions(method, head_dim, base, factor, length) == expected, (head_dim, length, factor, base)


# ------------------------------------------------------------------------------------------ independent formulas


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_none_and_ntk_match_formulas(head_dim: int, base: float) -> None:
    plain = plain_inv_freq(head_dim, base)
    inv, attn = scaled_inv_freq("none", head_dim, base, 1.0, 256)
    assert_inv_close(inv, plain, "none")
    assert attn == 1.0
    for factor in FACTORS:
        ntk_base = base * factor ** (head_dim / (head_dim - 2))
        inv, attn = scaled_inv_freq("ntk", head_dim, base, factor, 256)
        assert_inv_close(inv, plain_inv_freq(head_dim, ntk_base), f"ntk s={factor}")
        assert attn == 1.0
        # NTK-aware keeps the fastest pair and divides the slowest by exactly s
        assert inv[0].item() == 1.0
        assert inv[-1].item() == pytest.approx(plain[-1].item() / factor, rel=RTOL)


def test_dynamic_is_none_up_to_original_length_and_ntk_formula_beyond() -> None:
    head_dim, base, length, factor = 64, 10000.0, 256, 4.0
    plain, _ = scaled_inv_freq("none", head_dim, base, 1.0, length)
    for seq_len in (None, 1, 100, length):
        inv, _ = scaled_inv_freq("dynamic", head_dim, base, factor, length, seq_len)
        assert torch.equal(inv, plain)
    n = 1000
    expected = plain_inv_freq(head_dim, base * (factor * n / length - (factor - 1)) ** (head_dim / (head_dim - 2)))
    assert_inv_close(scaled_inv_freq("dynamic", head_dim, base, factor, length, n)[0], expected, "dynamic n=1000")


@pytest.mark.parametrize("method", ["linear", "ntk", "yarn", "llama3"])
def test_scaled_frequencies_lie_between_inv_over_s_and_inv(method: str) -> None:
    for head_dim, length, factor in itertools.product(HEAD_DIMS, ORIGINAL_LENGTHS, FACTORS):
        plain = plain_inv_freq(head_dim, 10000.0)
        inv = scaled_inv_freq(method, head_dim, 10000.0, factor, length)[0].double()
        assert bool((inv <= plain * (1 + RTOL)).all()) and bool((inv >= plain / factor * (1 - RTOL)).all())
        assert bool((inv[1:] < inv[:-1]).all())  # still strictly decreasing


# ------------------------------------------------------------------------------------ reference sheet worked values


@pytest.mark.parametrize(
    ("head_dim", "length", "low", "high"),
    [(64, 256, 0, 13), (64, 512, 3, 16), (64, 1024, 5, 18), (32, 128, 0, 6)],
)
def test_yarn_worked_ramps(head_dim: int, length: int, low: int, high: int) -> None:
    assert yarn_correction_range(head_dim, 10000.0, length) == (low, high)
    ramp = yarn_ramp(head_dim, 10000.0, length)
    assert torch.equal(ramp, ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1))
    assert frequency_regions("yarn", head_dim, 10000.0, 4.0, length) == {
        "keep": low + 1,
        "blend": high - low - 1,
        "interpolate": head_dim // 2 - high,
    }


def test_yarn_worked_regions_d64_l256() -> None:
    # "only pair 0 keeps its frequency, pairs 1-12 are blended, the rest interpolated"
    assert frequency_regions("yarn", 64, 10000.0, 8.0, 256) == {"keep": 1, "blend": 12, "interpolate": 19}


@pytest.mark.parametrize(("factor", "expected"), [(2, 1.0693), (4, 1.1386), (8, 1.2079), (16, 1.2773), (1, 1.0)])
def test_yarn_attention_factors(factor: float, expected: float) -> None:
    assert round(yarn_attention_factor(factor), 4) == expected
    assert round(scaled_inv_freq("yarn", 64, 10000.0, factor, 256)[1], 4) == expected
    assert yarn_attention_factor(factor) == pytest.approx(0.1 * math.log(factor) + 1.0)


def test_frequency_regions_simple_methods() -> None:
    assert frequency_regions("none", 64, 10000.0, 1.0, 256) == {"keep": 32, "blend": 0, "interpolate": 0}
    assert frequency_regions("linear", 64, 10000.0, 4.0, 256) == {"keep": 0, "blend": 0, "interpolate": 32}
    assert frequency_regions("ntk", 64, 10000.0, 4.0, 256) == {"keep": 1, "blend": 30, "interpolate": 1}
    assert frequency_regions("dynamic", 16, 10000.0, 4.0, 256) == {"keep": 1, "blend": 6, "interpolate": 1}
    for method in ("linear", "ntk", "dynamic", "yarn", "llama3"):
        assert frequency_regions(method, 64, 10000.0, 1.0, 256) == {"keep": 32, "blend": 0, "interpolate": 0}


# -------------------------------------------------------------------------------------------------- config & errors


def test_the_rope_scheme_uses_the_train_length_unless_original_length_given() -> None:
    def rope(scaling: RopeScalingConfig, head_dim: int) -> RoPE:
        return RoPE(RopeConfig(scaling=scaling), ModelConfig(d_model=2 * head_dim, n_head=2), train_length=256)

    params = YarnParams(beta_fast=16.0, truncate=False)
    inv, attn = rope(RopeScalingConfig(method="yarn", factor=4.0, params=params), 64).frequencies(100)
    ref, ref_attn = scaled_inv_freq("yarn", 64, 10000.0, 4.0, 256, beta_fast=16.0, truncate=False)
    assert torch.equal(inv, ref) and attn == ref_attn
    dynamic = rope(RopeScalingConfig(method="dynamic", factor=2.0, original_length=128), 32)
    assert torch.equal(dynamic.frequencies(512)[0], scaled_inv_freq("dynamic", 32, 10000.0, 2.0, 128, 512)[0])


@pytest.mark.parametrize(
    ("args", "params", "match"),
    [
        (("rope", 64, 10000.0, 2.0, 256), {}, "unknown RoPE scaling method"),
        (("linear", 64, 10000.0, 0.5, 256), {}, "factor must be >= 1"),
        (("yarn", 64, 10000.0, 2.0, 256), {"beta_fastt": 3.0}, "unknown RoPE scaling parameter"),
        (("llama3", 64, 10000.0, 2.0, 256), {"low_freq_factor": 4.0, "high_freq_factor": 4.0}, "low_freq_factor"),
        (("linear", 63, 10000.0, 2.0, 256), {}, "even"),
        (("ntk", 2, 10000.0, 2.0, 256), {}, ">= 4"),
        (("yarn", 64, 10000.0, 2.0, 0), {}, "original_length"),
        (("yarn", 64, 10000.0, 2.0, 256), {"beta_slow": 0.0}, "betas"),
    ],
)
def test_errors(args: tuple, params: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        scaled_inv_freq(*args, **params)
