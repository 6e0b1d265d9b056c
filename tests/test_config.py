"""Config schema: types, unknown keys and ranges are rejected with one line naming the key."""

from __future__ import annotations

import pytest

from posenc_cli.config import Config, config_to_dict, config_to_yaml
from posenc_cli.errors import ConfigError
from posenc_cli.run.config_load import config_from_dict, load_config_file


def base_dict() -> dict:
    return config_to_dict(Config())


def test_round_trip_through_yaml(tmp_path) -> None:
    cfg = config_from_dict(base_dict())
    path = tmp_path / "config.yaml"
    path.write_text(config_to_yaml(cfg))
    assert load_config_file(path) == cfg


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("model", "n_layer"), "abc", "model.n_layer: expected an integer"),
        (("model", "dropout"), 1.5, "model.dropout must be in [0, 1]"),
        (("model", "n_head"), 3, "model.n_head=3 does not divide model.d_model=128"),
        (("train", "seq_len"), 0, "train.seq_len must be >= 1"),
        (("train", "precision"), "fp16", "train.precision='fp16' is not one of"),
        (("train", "lr"), True, "train.lr: expected a number"),
        (("eval", "lengths"), [1, "x"], "eval.lengths[1]: expected a number"),
        (("extend", "factor"), 1.0, "extend.factor must be > 1"),
    ],
)
def test_bad_values_are_rejected(path: tuple[str, str], value: object, message: str) -> None:
    raw = base_dict()
    raw[path[0]][path[1]] = value
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_key_is_rejected_with_valid_keys() -> None:
    raw = base_dict()
    raw["model"]["n_layr"] = 4
    with pytest.raises(ConfigError, match=r"unknown config key 'model.n_layr' \(valid keys: .*n_layer"):
        config_from_dict(raw)


def test_unknown_top_level_group_is_rejected() -> None:
    raw = base_dict()
    raw["optimizer"] = {}
    with pytest.raises(ConfigError, match="unknown config key 'optimizer'"):
        config_from_dict(raw)


def test_pos_options_are_checked_against_the_schemes_own_schema() -> None:
    raw = base_dict()
    raw["pos"] = {"name": "nope", "base": 10000.0}
    with pytest.raises(ConfigError, match="unknown config key 'pos.base'"):
        config_from_dict(raw)
    raw["pos"] = {"name": "no_such_scheme"}
    with pytest.raises(ConfigError, match="unknown positional scheme pos=no_such_scheme"):
        config_from_dict(raw)


def test_ints_are_accepted_where_floats_are_expected() -> None:
    raw = base_dict()
    raw["train"]["lr"] = 1
    assert config_from_dict(raw).train.lr == 1.0


def test_load_config_file_errors_name_the_file(tmp_path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="config file not found"):
        load_config_file(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config_file(bad)
    # A YAML tag that would construct a Python object is refused by the safe loader.
    evil = tmp_path / "evil.yaml"
    evil.write_text("model: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="evil.yaml"):
        load_config_file(evil)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("train", "lr"), float("nan"), "train.lr: expected a finite number"),
        (("train", "weight_decay"), float("inf"), "train.weight_decay: expected a finite number"),
        (("eval", "lengths"), [1, float("nan")], "eval.lengths[1]: expected a finite number"),
        (("extend", "factor"), float("inf"), "extend.factor: expected a finite number"),
        (("train", "beta2"), 1.0, "train.beta2 must be < 1"),
        (("train", "beta1"), 1, "train.beta1 must be < 1"),
        (("train", "seed"), 2**70, "train.seed must be in [0, 2**63-1]"),
        (("train", "seed"), -1, "train.seed must be in [0, 2**63-1]"),
        (("extend", "beta_fast"), 0.0, "extend.beta_fast must be > 0"),
        (("extend", "attention_factor"), -1.0, "extend.attention_factor must be > 0"),
    ],
)
def test_non_finite_and_impossible_values_are_rejected(path: tuple[str, str], value: object, message: str) -> None:
    raw = base_dict()
    raw[path[0]][path[1]] = value
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert message in str(err.value)


def test_validate_catches_non_finite_values_set_directly() -> None:
    """Commands that build a group directly (extend's flags, eval's --lengths) are checked by validate() too."""
    from posenc_cli.config import EvalConfig, ExtendConfig

    for bad in (
        ExtendConfig(attention_factor=float("nan")),
        ExtendConfig(beta_slow=float("inf")),
        EvalConfig(lengths=[1.0, float("nan")]),
    ):
        with pytest.raises(ConfigError, match="must be a finite number"):
            bad.validate()
    cfg = Config()
    cfg.model.dropout = float("nan")
    with pytest.raises(ConfigError, match="model.dropout must be a finite number"):
        cfg.validate()


def test_largest_seed_is_accepted() -> None:
    raw = base_dict()
    raw["train"]["seed"] = 2**63 - 1
    assert config_from_dict(raw).train.seed == 2**63 - 1
