"""Composing configs from configs/ with Hydra overrides: the group files as differences from the dataclass defaults,
and the one-line errors for bad overrides."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from posenc_cli.config import ExtendConfig, TrainConfig, build_dataclass, config_dir
from posenc_cli.data.sources import config_class
from posenc_cli.errors import ConfigError
from posenc_cli.run.config_compose import compose_config, compose_dict, default_node, group_classes


def test_defaults_compose_to_the_documented_sizes() -> None:
    cfg = compose_config([])
    assert (cfg.model.d_model, cfg.model.n_layer, cfg.model.n_head) == (128, 4, 4)
    assert cfg.data.source == "stdlib"
    assert cfg.tokenizer.kind == "byte"
    assert cfg.train.seq_len == 128


@pytest.mark.parametrize(("preset", "sizes"), [("tiny", (128, 4, 4)), ("small", (256, 6, 8)), ("base", (512, 8, 8))])
def test_model_presets(preset: str, sizes: tuple[int, int, int]) -> None:
    cfg = compose_config([f"model={preset}"])
    assert (cfg.model.d_model, cfg.model.n_layer, cfg.model.n_head) == sizes


def test_overrides_reach_the_dataclasses() -> None:
    cfg = compose_config(["pos=nope", "train.steps=7", "data=text", "data.paths=[a.txt,b.txt]"])
    assert cfg.pos.name == "nope"
    assert cfg.train.steps == 7
    assert cfg.data.paths == ["a.txt", "b.txt"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.n_layer=abc", "model.n_layer: expected an integer, got 'abc'"),
        ("model.n_layr=4", "unknown config key 'model.n_layr'"),
        ("+model.n_layr=4", "unknown config key 'model.n_layr'"),
        ("model.n_head=3", "model.n_head=3 does not divide model.d_model=128"),
        ("data=nonexistent", "Could not find 'data/nonexistent' (available: "),  # every registered source follows
        ("pos=nonexistent", "Could not find 'pos/nonexistent'"),
        ("model.n_layer", "Error parsing override 'model.n_layer'"),
    ],
)
def test_bad_overrides_give_one_line(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        compose_config([override])
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_user_config_dir_adds_groups(tmp_path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "wide.yaml").write_text(
        "d_model: 192\nn_layer: 2\nn_head: 6\nnorm: rmsnorm\nmlp_ratio: 4\nbias: false\ndropout: 0.0\ninit_std: 0.02\n"
    )
    cfg = compose_config(["model=wide"], user_config_dir=tmp_path)
    assert (cfg.model.d_model, cfg.model.norm, cfg.model.bias) == (192, "rmsnorm", False)
    with pytest.raises(ConfigError, match="is not a directory"):
        compose_config([], user_config_dir=tmp_path / "missing")


GROUPS = ("model", "data", "tokenizer", "train", "eval", "extend")
GROUP_FILES = [(group, file.stem) for group in GROUPS for file in sorted((config_dir() / group).glob("*.yaml"))]
NEEDS = {("data", "text"): {"paths": ["x.txt"]}, ("data", "hf"): {"name": "wikitext"}}  # what validation requires


def _group_class(group: str, option: str) -> type:
    return config_class(option) if group == "data" else group_classes()[group]


@pytest.mark.parametrize(("group", "option"), GROUP_FILES, ids=[f"{g}={o}" for g, o in GROUP_FILES])
def test_a_group_file_states_only_what_differs_from_its_dataclass(group: str, option: str) -> None:
    """configs/<group>/<option>.yaml starts from the dataclass's defaults and names only keys that differ from them;
    `group=option` composes to the dataclass with those differences applied (every key overridable from the CLI)."""
    raw = yaml.safe_load((config_dir() / group / f"{option}.yaml").read_text()) or {}
    base = f"/dataclass/{group}/{option}" if group == "data" else f"/dataclass/{group}"
    assert raw.pop("defaults") == [f"{base}@_here_", "_self_"]
    cls = _group_class(group, option)
    defaults = default_node(cls())
    assert set(raw) <= set(defaults), f"not {cls.__name__} fields: {sorted(set(raw) - set(defaults))}"
    restated = sorted(key for key, value in raw.items() if defaults[key] == value)
    assert not restated, f"{group}/{option}.yaml restates {cls.__name__}'s defaults of {restated}"
    needs = NEEDS.get((group, option), {})
    composed = compose_dict(
        [
            f"{group}={option}",
            *(f"{group}.{k}=[{','.join(v)}]" if isinstance(v, list) else f"{group}.{k}={v}" for k, v in needs.items()),
        ]
    )[group]
    assert composed == {**defaults, **raw, **needs}
    assert build_dataclass(cls, composed, group) == dataclasses.replace(cls(), **raw, **needs)


def test_model_small_is_three_sizes() -> None:
    """The issue's example: model/small.yaml holds width, depth and heads, nothing else."""
    raw = yaml.safe_load((config_dir() / "model" / "small.yaml").read_text())
    assert {k: v for k, v in raw.items() if k != "defaults"} == {"d_model": 256, "n_layer": 6, "n_head": 8}


def test_a_field_added_to_a_dataclass_is_overridable_without_a_yaml_edit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The group node comes from the dataclass: a new field is a key `train.<field>=...` can set at once."""
    assert set(compose_dict([])["train"]) == {f.name for f in dataclasses.fields(TrainConfig)}
    assert compose_config(["train=quick", "train.window_start=document"]).train.window_start == "document"


def test_a_scaling_node_lists_no_params_so_another_method_takes_its_own() -> None:
    """extend's node holds `params: {}` (not YaRN's): extend.method=llama3 gets Llama3's defaults."""
    assert compose_dict([])["extend"]["params"] == {}
    assert default_node(ExtendConfig())["params"] == {}


def test_overrides_as_one_string_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"overrides are a list of strings, one per setting \(\['pos=rope', 'tr"):
        compose_config("pos=rope train.steps=10")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"override 'pos=rope train.steps=10' holds several settings; give one"):
        compose_config(["pos=rope train.steps=10"])
    assert compose_config(["data=text", "data.paths=['my notes.txt']"]).data.paths == ["my notes.txt"]


def test_an_unknown_scheme_key_lists_the_chosen_schemes_keys_with_a_suggestion() -> None:
    """`pos=rope pos.bse=500` used to list PosConfig's keys only ("valid keys: name")."""
    with pytest.raises(ConfigError, match=r"'pos.bse' \(did you mean pos.base\?; valid keys: base, layout, name,"):
        compose_config(["pos=rope", "pos.bse=500"])
    with pytest.raises(ConfigError, match=r"did you mean pos.num_buckets\?; valid keys: max_distance, name, num_bu"):
        compose_config(["pos=t5", "pos.num_bucket=8"])


def test_composing_imports_no_sweep_module() -> None:
    """Single-run composition is config loading's neighbour, not the sweep package's (`sweep.hydra_bridge` adds only
    Hydra's multirun)."""
    import subprocess
    import sys

    code = (
        "import sys; from posenc_cli.run.config_compose import compose_config; compose_config(['train.steps=1']); "
        "print(sorted(m for m in sys.modules if m.startswith('posenc_cli.sweep')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_api_refuses_overrides_as_one_string() -> None:
    """`api.train("pos=rope train.steps=10")` said "missing EQUAL at '<EOF>'" (the string was read character by
    character); the API's functions that take overrides name the fix instead."""
    from posenc_cli import api

    for call in (lambda: api.train_config("pos=rope train.steps=10"), lambda: api.plan_sweep("seeds", "pos=rope")):
        with pytest.raises(ConfigError, match=r"^overrides are a list of strings, one per setting"):
            call()  # type: ignore[no-untyped-call]
