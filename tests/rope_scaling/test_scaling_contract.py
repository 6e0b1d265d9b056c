"""Contract of every registered RoPE scaling method (posenc_cli/rope_scaling/): a new method file is tested here the
moment it exists. Numerics against `transformers` per method: tests/rope_scaling/test_scaling.py."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys

import pytest
import torch
from cli_utils import full_command_tree

from posenc_cli.config import ExtendConfig, build_dataclass
from posenc_cli.errors import NotExportable
from posenc_cli.positional.rope import RopeConfig
from posenc_cli.rope_scaling import NONE, RopeScalingConfig, ScalingParams, param_fields, registry
from posenc_cli.rope_scaling.frequencies import frequency_regions, frequency_summary, scaled_inv_freq
from posenc_cli.run.export_rope import neox_rope

METHODS = list(registry())
HEAD_DIMS = (8, 16, 64)
LENGTHS = (32, 256)
FACTORS = (1.5, 4.0, 16.0)
BASE = 10000.0


def seq_lens(name: str, length: int, factor: float) -> tuple[int | None, ...]:
    """Sequence lengths worth checking: only a length-dependent method's frequencies change with it."""
    return (None, length, round(factor * length)) if registry()[name].length_dependent else (None,)


def test_registry_is_not_empty_and_excludes_none() -> None:
    assert METHODS and NONE not in METHODS
    assert len({m.published for m in registry().values()}) >= 1


@pytest.mark.parametrize("name", METHODS)
def test_params_are_a_typed_frozen_dataclass(name: str) -> None:
    method = registry()[name]
    assert method.name == name and method.title and method.summary and method.paper
    cls = method.params_cls
    assert issubclass(cls, ScalingParams) and dataclasses.is_dataclass(cls)
    cls()  # every parameter has a default
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    for f in dataclasses.fields(cls):
        assert name in param_fields()[f.name].methods
        assert f.metadata.get("help"), f"{name}.{f.name} needs help text for its flag"


@pytest.mark.parametrize("name", METHODS)
def test_identity_at_factor_one(name: str) -> None:
    if not registry()[name].identity_at_one:
        pytest.skip(f"{name} is not plain RoPE at factor 1 by definition")
    for head_dim, length in itertools.product(HEAD_DIMS, LENGTHS):
        plain, _ = scaled_inv_freq(NONE, head_dim, BASE, 1.0, length)
        for seq_len in (None, length // 2, length):  # a length-dependent method: up to L (dynamic grows past it)
            inv, attention = scaled_inv_freq(name, head_dim, BASE, 1.0, length, seq_len)
            torch.testing.assert_close(inv, plain, rtol=1e-6, atol=0.0)
            assert attention == 1.0
        pairs = head_dim // 2
        assert frequency_regions(name, head_dim, BASE, 1.0, length) == {"keep": pairs, "blend": 0, "interpolate": 0}


@pytest.mark.parametrize("name", METHODS)
def test_frequencies_attention_and_regions_are_well_formed(name: str) -> None:
    method = registry()[name]
    for head_dim, length, factor in itertools.product(HEAD_DIMS, LENGTHS, FACTORS):
        if head_dim < method.min_rotary_dim:
            continue
        for seq_len in seq_lens(name, length, factor):
            inv, attention = scaled_inv_freq(name, head_dim, BASE, factor, length, seq_len)
            assert inv.shape == (head_dim // 2,) and inv.dtype == torch.float32
            assert bool(torch.isfinite(inv).all()) and bool((inv > 0).all())
            assert attention > 0
        regions = frequency_regions(name, head_dim, BASE, factor, length)
        assert set(regions) == {"keep", "blend", "interpolate"}
        assert all(v >= 0 for v in regions.values()) and sum(regions.values()) == head_dim // 2
        attention, summary_regions, (before, after) = frequency_summary(name, head_dim, BASE, factor, length)
        assert attention > 0 and summary_regions == regions and after >= before > 0


@pytest.mark.parametrize("name", METHODS)
def test_config_keys_round_trip(name: str) -> None:
    """A method's own parameters, and only those, are `pos.scaling.params` and `extend.params` keys; a saved
    mapping rebuilds the same config, and so does the flat layout that runs were saved in before."""
    cfg = RopeScalingConfig(method=name, factor=4.0, original_length=64)
    assert isinstance(cfg.params, registry()[name].params_cls)
    raw = dataclasses.asdict(cfg)
    assert list(raw) == ["method", "factor", "original_length", "params"]
    assert set(raw["params"]) == {f.name for f in dataclasses.fields(registry()[name].params_cls)}
    assert build_dataclass(RopeScalingConfig, raw, "pos.scaling") == cfg
    ext = ExtendConfig(method=name)
    assert build_dataclass(ExtendConfig, dataclasses.asdict(ext), "extend") == ext
    flat = {"method": name, "factor": 4.0, "original_length": 64, **{k: f.default for k, f in param_fields().items()}}
    assert build_dataclass(RopeScalingConfig, flat, "pos.scaling") == cfg  # the layout before params


@pytest.mark.parametrize("name", METHODS)
def test_cli_has_the_shorthand_and_the_parameter_flags(name: str) -> None:
    extend = full_command_tree().commands["extend"]  # type: ignore[attr-defined]
    flags = {opt for p in extend.params for opt in (*p.opts, *p.secondary_opts)}
    assert f"--{name}" in flags
    for f in dataclasses.fields(registry()[name].params_cls):
        assert "--" + f.name.replace("_", "-") in flags


@pytest.mark.parametrize("name", METHODS)
def test_transformers_parameters_round_trip_through_export(name: str) -> None:
    """Exported rope parameters give transformers the same frequencies and attention factor as posenc's maths."""
    method = registry()[name]
    head_dim, length, factor = 16, 64, 4.0
    pos = RopeConfig(base=BASE, scaling=RopeScalingConfig(method=name, factor=factor, original_length=length))
    if method.rope_type is None:
        with pytest.raises(NotExportable):
            neox_rope(pos, head_dim, length)
        return
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    transformers.logging.set_verbosity_error()
    rope_scaling, base, _, max_pos = neox_rope(pos, head_dim, length)
    assert (rope_scaling or {"rope_type": "default"})["rope_type"] == method.rope_type
    config = transformers.LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        rope_theta=base,
        rope_scaling=rope_scaling,
    )
    params = getattr(config, "rope_parameters", None) or config.rope_scaling or {"rope_type": "default"}
    for seq_len in seq_lens(name, length, factor):
        if method.rope_type == "default":  # plain RoPE with the exported rope_theta
            ref, ref_attention = base ** -(torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim), 1.0
        else:
            ref, ref_attention = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, None, seq_len=seq_len)
        ours, attention = scaled_inv_freq(name, head_dim, BASE, factor, length, seq_len)
        torch.testing.assert_close(ours.double(), ref.double(), rtol=1e-6, atol=0.0)
        assert attention == pytest.approx(float(ref_attention))


def test_reading_the_registry_loads_no_torch() -> None:
    """Every method module imports without torch (its maths imports it when called), so `extend --help`, which
    reads each method's flags, and a config's validation of the method's parameters stay light."""
    code = (
        "import sys\nfrom posenc_cli.rope_scaling import param_fields, registry\n"
        "assert len(registry()) > 1 and param_fields()\nsys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
