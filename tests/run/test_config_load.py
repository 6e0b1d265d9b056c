"""config_load's dotted overrides, read without Hydra: the one place outside the sweep's Hydra bridge that uses
OmegaConf (eval-extrapolate's data overrides, `train --resume` overrides)."""

from __future__ import annotations

import pytest

from posenc_cli.errors import ConfigError
from posenc_cli.run.config_load import dotlist_dict, merge_dotlist


def test_dotlist_dict_reads_lists_nulls_and_numbers_into_nested_keys() -> None:
    parsed = dotlist_dict(["data.paths=[a,b]", "train.steps=8", "data.val_paths=null", "train.lr=1e-3"])
    assert parsed == {"data": {"paths": ["a", "b"], "val_paths": None}, "train": {"steps": 8, "lr": 1e-3}}


def test_a_bad_override_is_one_config_error_line_with_its_prefix() -> None:
    with pytest.raises(ConfigError, match=r"^bad data override: Interpolation key 'nope' not found$"):
        dotlist_dict(["data.paths=${nope}"], error_prefix="bad data override: ")
    with pytest.raises(ConfigError, match=r"^Interpolation key 'nope' not found$"):
        merge_dotlist({"train": {"steps": 4}}, ["train.steps=${nope}"])


def test_merge_dotlist_sets_keys_on_a_copy() -> None:
    base = {"train": {"steps": 4, "lr": 0.1}, "pos": {"name": "rope"}}
    assert merge_dotlist(base, ["train.steps=800", "eval.tokens=64"]) == {
        "train": {"steps": 800, "lr": 0.1},
        "pos": {"name": "rope"},
        "eval": {"tokens": 64},
    }
    assert base == {"train": {"steps": 4, "lr": 0.1}, "pos": {"name": "rope"}}  # unchanged
