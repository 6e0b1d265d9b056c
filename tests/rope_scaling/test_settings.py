"""RoPE scaling settings nested per method (`{method, factor, original_length, params}`): parsed by the method's own
params class, the flat layout of runs saved before still read, the old override keys refused naming the new ones,
and the registry loaded lazily."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from posenc_cli.config import (
    Config,
    ExtendConfig,
    build_dataclass,
    config_to_dict,
    flatten,
    nest_flat_scaling_keys,
    unknown_key_message,
)
from posenc_cli.errors import ConfigError
from posenc_cli.extension.child_run import recorded_extension
from posenc_cli.positional.rope import RoPE
from posenc_cli.rope_scaling import RopeScalingConfig, ScalingParams
from posenc_cli.rope_scaling.frequencies import scaled_inv_freq
from posenc_cli.rope_scaling.llama3 import Llama3Params
from posenc_cli.rope_scaling.yarn import YarnParams
from posenc_cli.run.config_compose import compose_config
from posenc_cli.run.config_load import config_from_dict
from posenc_cli.sweep.identity import ADDED_KEYS, field_default
from posenc_cli.untrusted import load_yaml

# A YaRN child's config.yaml as posenc wrote it before the nesting (every method's parameters beside `method`, in
# pos.scaling and in extend); beta_fast and the llama3 values changed from their defaults.
OLD_LAYOUT = """\
model: {d_model: 32, n_layer: 2, n_head: 2, norm: layernorm, mlp_ratio: 2, bias: true, dropout: 0.0, init_std: 0.02,
        embedding: gpt2, attn_scale: none, logn_length: 0}
pos:
  name: rope
  base: 10000.0
  layout: rotate_half
  rotary_fraction: 1.0
  scaling:
    method: yarn
    factor: 2.0
    original_length: 16
    beta_fast: 16.0
    beta_slow: 1.0
    attention_factor: null
    truncate: true
    short_factor: null
    long_factor: null
    low_freq_factor: 2.0
    high_freq_factor: 8.0
  p: 1.0
  remap: {method: none, window: 0, group: 0, leaky: 0.0}
tokenizer: {kind: byte, vocab_size: 257}
train: {seq_len: 16, batch_size: 4, steps: 4, precision: fp32}
extend:
  method: yarn
  factor: 2.0
  original_length: null
  beta_fast: 16.0
  beta_slow: 1.0
  attention_factor: null
  truncate: true
  short_factor: null
  long_factor: null
  low_freq_factor: 1.0
  high_freq_factor: 4.0
  finetune_steps: 0
  finetune_seq_len: null
  finetune_lr: 0.0003
  finetune_warmup: 5
  pose: false
  pose_chunks: 2
  logn: false
  remap: none
  remap_window: 0
  remap_group: 0
  remap_leaky: 0.0
  remap_logn: null
  longrope_search: 0
  longrope_search_seed: 0
"""


def test_a_config_saved_in_the_flat_layout_loads_as_the_same_scaling(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(OLD_LAYOUT)
    cfg = config_from_dict(load_yaml(path, what="config file"), saved=True)
    scaling = cfg.pos.scaling  # type: ignore[attr-defined]
    assert scaling == RopeScalingConfig(
        method="yarn", factor=2.0, original_length=16, params=YarnParams(beta_fast=16.0)
    )
    assert cfg.extend.params == YarnParams(beta_fast=16.0) and cfg.extend.finetune_lr == 3e-4
    inv, attention = RoPE(cfg.pos, cfg.model, train_length=16).frequencies(64)  # the numbers of the old reading
    ref, ref_attention = scaled_inv_freq("yarn", 16, 10000.0, 2.0, 16, 64, beta_fast=16.0)
    assert torch.equal(inv, ref) and attention == ref_attention
    saved = config_to_dict(cfg)  # written again in today's layout, only the method's own parameters
    assert saved["pos"]["scaling"]["params"] == {"beta_fast": 16.0, "beta_slow": 1.0, "attention_factor": None,
                                                 "truncate": True, "mscale": None, "mscale_all_dim": None}  # fmt: skip
    assert "beta_fast" not in saved["extend"] and config_from_dict(saved) == cfg


def test_flat_dotted_keys_of_the_old_layout_match_todays() -> None:
    """A sweep's recorded identity (dotted keys) from before the nesting equals today's for the same config."""
    old = flatten(yaml.safe_load(OLD_LAYOUT))
    today = flatten(config_to_dict(config_from_dict(yaml.safe_load(OLD_LAYOUT), saved=True)))
    today = {k: v for k, v in today.items() if not (k in ADDED_KEYS and field_default(k, today) == v)}  # added since
    scaling = ("pos.scaling.", "extend.")
    assert {k: v for k, v in nest_flat_scaling_keys(old).items() if k.startswith(scaling)} == {
        k: v for k, v in today.items() if k.startswith(scaling)
    }
    assert nest_flat_scaling_keys(today) == today


def test_params_are_parsed_by_the_methods_own_class() -> None:
    raw = {"method": "llama3", "factor": 8.0, "params": {"low_freq_factor": 2, "high_freq_factor": 8}}
    assert build_dataclass(RopeScalingConfig, raw, "pos.scaling").params == Llama3Params(
        low_freq_factor=2.0, high_freq_factor=8.0
    )
    with pytest.raises(ConfigError, match=r"unknown config key 'pos.scaling.params.beta_fast' .*low_freq_factor"):
        build_dataclass(RopeScalingConfig, {**raw, "params": {"beta_fast": 1.0}}, "pos.scaling")
    with pytest.raises(ConfigError, match=r"pos.scaling.params.truncate: expected true/false"):
        build_dataclass(RopeScalingConfig, {"method": "yarn", "params": {"truncate": "yes"}}, "pos.scaling")
    with pytest.raises(ConfigError, match=r"extend.method='none' is not one of linear, ntk"):
        build_dataclass(ExtendConfig, {"method": "none"}, "extend")
    assert build_dataclass(RopeScalingConfig, {"method": "none"}, "pos.scaling").params == ScalingParams()
    with pytest.raises(ConfigError, match="RoPE scaling 'llama3' takes Llama3Params parameters, got YarnParams"):
        RopeScalingConfig(method="llama3", params=YarnParams())


def test_an_old_flat_key_beside_params_names_its_new_key() -> None:
    raw = config_to_dict(Config())
    raw["extend"]["beta_fast"] = 16.0
    with pytest.raises(ConfigError, match=r"'extend.beta_fast' is now 'extend.params.beta_fast'.*\+extend.params"):
        config_from_dict(raw)


def test_overrides_as_users_type_them() -> None:
    assert compose_config(["extend.method=llama3", "extend.factor=8"]).extend.params == Llama3Params()
    assert compose_config(["+extend.params.beta_fast=16"]).extend.params == YarnParams(beta_fast=16.0)
    cfg = compose_config(["pos=rope", "pos.scaling.method=yarn", "+pos.scaling.params.beta_slow=2"])
    assert cfg.pos.scaling.params == YarnParams(beta_slow=2.0)  # type: ignore[attr-defined]
    moved = {
        "extend.beta_fast=16": "extend.params.beta_fast",
        "pos.scaling.truncate=false": "pos.scaling.params.truncate",
    }
    for override, new in moved.items():
        with pytest.raises(ConfigError, match=f"is now '{new}'") as e:
            compose_config(["pos=rope", override])
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"add it with \+extend.params.beta_fast=VALUE"):
        compose_config(["extend.params.beta_fast=16"])
    assert "is now 'pos.scaling.params.long_factor'" in unknown_key_message("pos.scaling.long_factor")


def test_an_old_childs_flat_record_is_the_same_extension_asked_again() -> None:
    flat = {"method": "yarn", "factor": 2.0, "original_length": 16, "beta_fast": 32.0, "beta_slow": 1.0,
            "attention_factor": None, "truncate": True, "short_factor": None, "long_factor": None,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0}  # fmt: skip
    nested = config_to_dict(RopeScalingConfig(method="yarn", factor=2.0, original_length=16))
    assert recorded_extension({"extend": {"method": "yarn", "scaling": flat}})["scaling"] == nested
    before_mscale = {**nested, "params": {k: v for k, v in nested["params"].items() if not k.startswith("mscale")}}
    assert recorded_extension({"extend": {"method": "yarn", "scaling": before_mscale}})["scaling"] == nested
    assert recorded_extension({"extend": {"method": "rerope", "scaling": None}})["scaling"] is None


def test_importing_the_package_loads_no_method() -> None:
    code = (
        "import sys, posenc_cli.config, posenc_cli.rope_scaling as r; "
        "print(sorted(m for m in sys.modules if m.startswith('posenc_cli.rope_scaling.'))); "
        "r.registry(); print(len([m for m in sys.modules if m.startswith('posenc_cli.rope_scaling.')]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "[]" and int(out[1]) >= 6
