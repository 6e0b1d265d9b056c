"""Composing configs from configs/ with Hydra overrides, and the one-line errors for bad ones."""

from __future__ import annotations

import pytest
from launchers import needs_joblib, needs_submitit

from posenc_cli.config import config_dir
from posenc_cli.errors import ConfigError
from posenc_cli.sweep.hydra_bridge import compose_config

pytestmark = pytest.mark.integration  # end to end (sweeps, launchers, DDP, compile): not in the fast lane


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


def test_every_shipped_yaml_composes() -> None:
    root = config_dir()
    for group in ("model", "data", "tokenizer", "train", "eval", "extend"):
        for option in sorted((root / group).glob("*.yaml")):
            overrides = [f"{group}={option.stem}"]
            if group == "data" and option.stem == "text":
                overrides.append("data.paths=[x.txt]")
            if group == "data" and option.stem == "hf":
                overrides.append("data.name=wikitext")
            compose_config(overrides)


@needs_joblib
@needs_submitit
def test_launcher_settings_validate_name_and_keys_like_the_launch() -> None:
    from posenc_cli.sweep.hydra_bridge import launcher_settings

    assert launcher_settings([]) == ("basic", {})
    assert launcher_settings(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]) == ("joblib", {"n_jobs": 2})
    slurm = ["hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu"]
    assert launcher_settings(slurm) == ("submitit_slurm", {"partition": "gpu"})
    with pytest.raises(ConfigError, match=r"unknown launcher hydra/launcher=submitit_slrum \(did you mean submitit_s"):
        launcher_settings(["hydra/launcher=submitit_slrum"])
    with pytest.raises(ConfigError, match=r"unknown launcher key 'hydra.launcher.partiton' \(did you mean partition"):
        launcher_settings(["hydra/launcher=submitit_slurm", "hydra.launcher.partiton=gpu"])


def test_an_unknown_scheme_key_lists_the_chosen_schemes_keys_with_a_suggestion() -> None:
    """`pos=rope pos.bse=500` used to list PosConfig's keys only ("valid keys: name")."""
    with pytest.raises(ConfigError, match=r"'pos.bse' \(did you mean pos.base\?; valid keys: base, layout, name,"):
        compose_config(["pos=rope", "pos.bse=500"])
    with pytest.raises(ConfigError, match=r"did you mean pos.num_buckets\?; valid keys: max_distance, name, num_bu"):
        compose_config(["pos=t5", "pos.num_bucket=8"])
