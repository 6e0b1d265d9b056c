"""Config schema: types, unknown keys and ranges are rejected with one line naming the key."""

from __future__ import annotations

import pytest

from posenc_cli.config import Config, config_to_dict, config_to_yaml
from posenc_cli.errors import ConfigError
from posenc_cli.run.config_load import config_from_dict
from posenc_cli.untrusted import load_yaml


def base_dict() -> dict:
    return config_to_dict(Config())


def test_round_trip_through_yaml(tmp_path) -> None:
    cfg = config_from_dict(base_dict())
    path = tmp_path / "config.yaml"
    path.write_text(config_to_yaml(cfg))
    assert config_from_dict(load_yaml(path, what="config file"), saved=True) == cfg


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
        (("extend", "remap"), "self_extend", "unknown extend.remap 'self_extend' (available: none, self-extend"),
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
    with pytest.raises(ConfigError, match=r"unknown config key 'model.n_layr' \(.*valid keys: .*n_layer"):
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


def test_reading_a_config_file_names_the_file(tmp_path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="config file not found"):
        load_yaml(missing, what="config file")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: config file is not valid YAML"):
        load_yaml(bad, what="config file")
    # A YAML tag that would construct a Python object is refused by the safe loader.
    evil = tmp_path / "evil.yaml"
    evil.write_text("model: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="evil.yaml"):
        load_yaml(evil, what="config file")


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
        (("extend", "params", "beta_fast"), 0.0, "extend.params.beta_fast must be > 0"),
        (("extend", "params", "attention_factor"), -1.0, "extend.params.attention_factor must be > 0"),
        (("extend", "params", "beta_slow"), float("nan"), "extend.params.beta_slow: expected a finite number"),
    ],
)
def test_non_finite_and_impossible_values_are_rejected(path: tuple[str, ...], value: object, message: str) -> None:
    raw = base_dict()
    group = raw
    for key in path[:-1]:
        group = group[key]
    group[path[-1]] = value
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert message in str(err.value)


def test_validate_catches_non_finite_values_set_directly() -> None:
    """Commands that build a group directly (extend's flags, eval's --lengths) are checked by validate() too."""
    from posenc_cli.config import EvalConfig, ExtendConfig
    from posenc_cli.rope_scaling.yarn import YarnParams

    for bad in (
        ExtendConfig(params=YarnParams(attention_factor=float("nan"))),
        ExtendConfig(params=YarnParams(beta_slow=float("inf"))),
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


# -- "did you mean": the valid keys of the class a composition selects, and the closest of them ---------------------


def test_suggest_names_the_closest_choice_or_nothing() -> None:
    from posenc_cli.config import suggest

    assert suggest("bse", ["base", "layout", "name"]) == " (did you mean base?)"
    assert suggest("zzzz", ["base", "layout"]) == ""


def test_an_unknown_key_of_a_schemes_options_lists_that_schemes_keys() -> None:
    from posenc_cli.run.config_load import unknown_override_message

    message = unknown_override_message("pos.bse", ["pos=rope", "pos.bse=500"])
    assert message.startswith("unknown config key 'pos.bse' (did you mean pos.base?; valid keys: base, ")
    assert "rotary_fraction" in message
    assert "pos.base?" in unknown_override_message("pos.bse", ["pos.bse=500"])  # rope: the root config's default
    assert "did you mean data.paths?" in unknown_override_message("data.pathz", ["data=text"])


def test_an_unknown_group_lists_the_groups_and_suggests_one() -> None:
    from posenc_cli.config import unknown_key_message

    assert unknown_key_message("trian.steps") == (
        "unknown config key 'trian.steps' (no group 'trian'; did you mean train?; "
        "groups: data, eval, extend, model, pos, tokenizer, train)"
    )
    raw = base_dict()
    raw["model"]["n_layr"] = 4
    with pytest.raises(ConfigError, match=r"'model.n_layr' \(did you mean model.n_layer\?; valid keys: "):
        config_from_dict(raw)


# -- a user's --config-dir: safe YAML only, one line naming the file -------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "evil.yaml",
            "name: rope\nbase: !!python/object/apply:os.system ['touch {marker}']\n",
            "constructor for the tag",
        ),
        ("list.yaml", "- 1\n- 2\n", "is not a mapping"),
        ("deep.yaml", "[" * 100_000 + "]" * 100_000, "config file is"),
        ("bad.yml", "a: [1\n", "is not valid YAML"),
    ],
)
def test_a_config_dir_with_an_unsafe_file_is_refused_naming_it(tmp_path, name: str, text: str, message: str) -> None:
    from posenc_cli.config import check_config_dir

    marker = tmp_path / "pwned"
    (tmp_path / "cfg" / "pos").mkdir(parents=True)
    (tmp_path / "cfg" / "pos" / "fine.yaml").write_text("name: rope\nbase: 500.0\n")
    check_config_dir(tmp_path / "cfg")
    (tmp_path / "cfg" / "pos" / name).write_text(text.format(marker=marker))
    with pytest.raises(ConfigError, match=message) as err:
        check_config_dir(tmp_path / "cfg")
    assert str(err.value).startswith(str(tmp_path / "cfg" / "pos" / name)) and "\n" not in str(err.value)
    assert not marker.exists()
    with pytest.raises(ConfigError, match="no such directory"):
        check_config_dir(tmp_path / "nope")


STRIDE_RULE = "eval.stride (--stride) needs eval.protocol (--protocol) sliding or streaming, not nonoverlap"


def test_a_stride_without_a_protocol_that_takes_one_is_refused_by_the_config() -> None:
    """The rule lives in EvalConfig.validate, so every door refuses it alike (was: api.eval_config only, and a sweep's
    eval.stride=64 with the default protocol was accepted)."""
    raw = base_dict()
    raw["eval"]["stride"] = 64
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert str(err.value) == STRIDE_RULE
    for protocol in ("sliding", "streaming"):
        raw["eval"]["protocol"] = protocol
        assert config_from_dict(raw).eval.stride == 64


def test_a_saved_config_with_an_unused_stride_still_loads(tmp_path) -> None:
    """A run trained with eval.stride under the default protocol (accepted before the rule) loads, without the
    stride it never used."""
    raw = base_dict()
    raw["eval"]["stride"] = 64
    assert config_from_dict(raw, saved=True).eval.stride is None


def test_the_cli_the_api_and_a_sweeps_dry_run_refuse_a_stride_alike(tmp_path) -> None:
    from typer.testing import CliRunner

    from posenc_cli import api
    from posenc_cli.cli import app

    with pytest.raises(ConfigError, match=r"^eval.stride \(--stride\) needs eval.protocol \(--protocol\) sliding"):
        api.eval_config(stride=64)
    with pytest.raises(ConfigError, match=r"^eval.stride \(--stride\) needs eval.protocol \(--protocol\) sliding"):
        api.train_config(["eval.stride=64"])
    runner = CliRunner()
    for args in (
        ["eval-extrapolate", str(tmp_path), "--stride", "64"],
        ["train", "eval.stride=64", "--out", str(tmp_path / "run")],
        ["sweep", "extrapolation", "eval.stride=64", "--dry-run", "--out", str(tmp_path / "sweep")],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        lines = [ln for ln in result.stderr.splitlines() if ln.strip() and not ln.startswith("warning: this machine")]
        assert len(lines) == 1 and lines[0].endswith(STRIDE_RULE), (args, result.stderr)
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


def test_the_cli_the_api_and_a_sweep_refuse_an_extension_factor_alike(tmp_path) -> None:
    """factor > 1 lives in ExtendConfig.validate (pos.scaling's >= 1 in the scheme's): every door names the key."""
    from typer.testing import CliRunner

    from posenc_cli import api
    from posenc_cli.cli import app

    rule = "extend.factor must be > 1, got 1.0"
    with pytest.raises(ConfigError, match=rf"^{rule}$"):
        api.extend(tmp_path / "run", factor=1.0)
    runner = CliRunner()
    for args in (
        ["extend", str(tmp_path / "run"), "--factor", "1"],
        ["sweep", "extrapolation", "extend.factor=1", "--dry-run", "--out", str(tmp_path / "sweep")],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        lines = [ln for ln in result.stderr.splitlines() if ln.strip() and not ln.startswith("warning: this machine")]
        assert len(lines) == 1 and lines[0].endswith(rule), (args, result.stderr)
