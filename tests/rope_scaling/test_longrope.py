"""LongRoPE (posenc_cli/rope_scaling/longrope.py): parity with `transformers`' `longrope` rope type (inverse
frequencies and attention factor, short and long regime), the factors' checks, the factors file, config round trip."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from posenc_cli.config import build_dataclass, config_to_dict
from posenc_cli.errors import ConfigError
from posenc_cli.positional.rope import RopeConfig
from posenc_cli.rope_scaling import RopeScalingConfig
from posenc_cli.rope_scaling.frequencies import frequency_regions, scaled_inv_freq
from posenc_cli.rope_scaling.longrope import LongRopeParams, longrope_attention_factor, read_factors_file

HEAD_DIMS = (8, 16, 64, 128)
ORIGINAL_LENGTHS = (16, 128, 4096)
FACTORS = (1.0, 1.5, 4.0, 16.0)
BASES = (10000.0, 500000.0)


def random_factors(pairs: int, seed: int, top: float) -> list[float]:
    """Monotone-ish positive factors in [1, top] (LongRoPE's searched shape), plus some below 1 (allowed)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.sort(torch.rand(pairs, generator=g, dtype=torch.float64) * (top - 0.5) + 0.5).values
    return values.tolist()


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    transformers.logging.set_verbosity_error()
    return transformers.LlamaConfig, ROPE_INIT_FUNCTIONS


def hf_longrope(hf, head_dim: int, base: float, length: int, factor: float, seq_len: int | None, **scaling):
    config = hf[0](
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max(length, round(factor * length)),
        rope_theta=base,
        rope_scaling={"rope_type": "longrope", "factor": factor, "original_max_position_embeddings": length, **scaling},
    )
    inv_freq, attention = hf[1]["longrope"](config, None, seq_len=seq_len)
    return inv_freq, float(attention)


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_longrope_matches_transformers_in_both_regimes(hf, head_dim: int, base: float) -> None:
    pairs = head_dim // 2
    for (length, factor), seed in zip(itertools.product(ORIGINAL_LENGTHS, FACTORS), itertools.count()):
        short = random_factors(pairs, 2 * seed, 1.5)
        long = random_factors(pairs, 2 * seed + 1, 1.25 * factor)
        # None and <= L: short factors; > L: long ones (transformers: `if seq_len and seq_len > L`)
        for seq_len in (None, 1, length // 2, length, length + 1, round(factor * length), 4 * length):
            ref, ref_attention = hf_longrope(
                hf, head_dim, base, length, factor, seq_len, short_factor=short, long_factor=long
            )
            ours, attention = scaled_inv_freq(
                "longrope", head_dim, base, factor, length, seq_len, short_factor=short, long_factor=long
            )
            what = f"longrope d={head_dim} L={length} s={factor} n={seq_len}"
            assert ours.dtype == torch.float32 and ours.shape == ref.shape, what
            torch.testing.assert_close(
                ours.double(), ref.double(), rtol=1e-6, atol=0.0, msg=lambda m, w=what: f"{w}: {m}"
            )
            assert attention == pytest.approx(ref_attention, rel=1e-6, abs=0.0), what
            regime = long if seq_len is not None and seq_len > length else short
            plain = base ** -(torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
            torch.testing.assert_close(
                ours.double(), plain / torch.tensor(regime, dtype=torch.float64), rtol=1e-6, atol=0
            )


@pytest.mark.parametrize("attention_factor", [0.7, 1.0, 1.3])
def test_given_attention_factor_matches_transformers(hf, attention_factor: float) -> None:
    ones = [1.0] * 8
    for factor in (1.0, 4.0):
        _, ref = hf_longrope(hf, 16, 10000.0, 64, factor, None, short_factor=ones, long_factor=ones,
                             attention_factor=attention_factor)  # fmt: skip
        _, ours = scaled_inv_freq("longrope", 16, 10000.0, factor, 64, attention_factor=attention_factor)
        assert ours == pytest.approx(ref, rel=1e-12) == attention_factor


def test_default_attention_factor_formula() -> None:
    """√(1 + ln s / ln L) for s > 1 (the reference sheet's value), 1 at s <= 1."""
    assert longrope_attention_factor(4.0, 128) == pytest.approx(math.sqrt(1 + math.log(4) / math.log(128)))
    assert longrope_attention_factor(1.0, 128) == 1.0
    with pytest.raises(ConfigError, match="original length >= 2"):
        longrope_attention_factor(4.0, 1)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"long_factor": [1.0, 2.0]}, "long_factor has 2 values; this RoPE has 4 frequency pairs"),
        ({"short_factor": [1.0] * 5}, "short_factor has 5 values"),
        ({"long_factor": [1.0, 2.0, float("nan"), 4.0]}, "long_factor must be finite"),
        ({"long_factor": [1.0, 2.0, float("inf"), 4.0]}, "long_factor must be finite"),
        ({"short_factor": [1.0, 0.0, 1.0, 1.0]}, "short_factor must be > 0"),
        ({"long_factor": [1.0, -2.0, 3.0, 4.0]}, "long_factor must be > 0"),
    ],
)
def test_bad_factors_are_one_line_errors(params: dict, message: str) -> None:
    for seq_len in (None, 100):  # both lists are checked in either regime
        with pytest.raises(ConfigError, match=message) as e:
            scaled_inv_freq("longrope", 8, 10000.0, 4.0, 32, seq_len, **params)
        assert "\n" not in str(e.value)


def test_regions_count_kept_blended_and_interpolated_long_pairs() -> None:
    regions = frequency_regions("longrope", 8, 10000.0, 4.0, 32, long_factor=[1.0, 2.0, 4.0, 5.0])
    assert regions == {"keep": 1, "blend": 1, "interpolate": 2}


def test_factors_are_saved_in_pos_scaling_and_reloaded() -> None:
    short, long = [1.0, 1.0, 1.1, 1.2], [1.0, 1.5, 3.0, 4.5]
    params = LongRopeParams(short_factor=short, long_factor=long)
    cfg = RopeConfig(scaling=RopeScalingConfig(method="longrope", factor=4.0, original_length=32, params=params))
    raw = json.loads(json.dumps(config_to_dict(cfg)))  # what config.yaml holds, through plain types
    assert raw["scaling"]["params"] == {"short_factor": short, "long_factor": long, "attention_factor": None}
    back = build_dataclass(RopeScalingConfig, raw["scaling"], "pos.scaling")
    assert back == cfg.scaling and back.params.long_factor == long and back.params.short_factor == short
    bad = {**raw["scaling"], "params": {"long_factor": [1.0, "x"]}}
    with pytest.raises(ConfigError, match=r"pos.scaling.params.long_factor\[1\]: expected a number"):
        build_dataclass(RopeScalingConfig, bad, "pos.scaling")


def write(tmp_path: Path, obj: object, text: str | None = None) -> Path:
    path = tmp_path / "factors.json"
    path.write_text(text if text is not None else json.dumps(obj))
    return path


def test_factors_file_is_read_and_checked(tmp_path: Path) -> None:
    good = {"short_factor": [1, 1, 1, 1], "long_factor": [1, 2, 3, 4.5], "score": 3.2}  # other keys ignored
    assert read_factors_file(write(tmp_path, good)) == {
        "short_factor": [1.0, 1.0, 1.0, 1.0],
        "long_factor": [1.0, 2.0, 3.0, 4.5],
    }
    bad = [
        (None, "{", "not valid JSON"),
        ([1, 2], None, "expected an object"),
        ({"long_factor": [1.0]}, None, "missing 'short_factor'"),
        ({"short_factor": [1.0], "long_factor": "1,2"}, None, "'long_factor' must be a non-empty list"),
        ({"short_factor": [1.0], "long_factor": []}, None, "'long_factor' must be a non-empty list"),
        ({"short_factor": [1.0, "a"], "long_factor": [1.0, 2.0]}, None, "short_factor must hold numbers only"),
        ({"short_factor": [1.0, 0.0], "long_factor": [1.0, 2.0]}, None, "short_factor must be > 0"),
        ({"short_factor": [1.0], "long_factor": [1.0, 2.0]}, None, "short_factor has 1 values and long_factor 2"),
    ]
    for obj, text, message in bad:
        with pytest.raises(ConfigError, match=message) as e:
            read_factors_file(write(tmp_path, obj, text))
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="cannot read it"):
        read_factors_file(tmp_path / "missing.json")
    path = write(tmp_path, None, '{"short_factor": [1.0, NaN], "long_factor": [1.0, 2.0]}')  # json accepts NaN
    with pytest.raises(ConfigError, match="short_factor must be finite"):
        read_factors_file(path)
