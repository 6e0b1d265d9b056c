"""A sweep job's identity (`sweep.identity`) as pure functions: fixed for today's defaults, blind to the keys added
since identities were first recorded (at their dataclass default), and one list of the keys that are no identity."""

from __future__ import annotations

import dataclasses

import pytest

from posenc_cli.analysis.rows import config_identity
from posenc_cli.config import RUNTIME_KEYS, Config, TrainConfig, config_to_dict, flatten
from posenc_cli.data.sources import config_class as data_config_class
from posenc_cli.data.sources import registry as source_registry
from posenc_cli.positional import config_class
from posenc_cli.positional import registry as scheme_registry
from posenc_cli.run.config_compose import compose_config
from posenc_cli.run.meta import RunMeta
from posenc_cli.sweep.identity import ADDED_KEYS, field_default, identity_hash, job_identity, numbers_keys

# The identity hashes of configs at today's defaults, as every posenc since the record began computed them. A field
# added to a config dataclass changes them unless its key is in ADDED_KEYS (at a default that does what was done
# before the field existed): sweeps planned before it would then refuse their own finished jobs.
FIXED = {
    "nope": "64971ef89b6f6e85",
    "rope": "d96a16f2cdbd69de",
    "alibi": "7a3672f541e77ab6",
    "t5": "0d42a82821c5ac6e",
    "learned": "3596270cfcb338f4",
    "sinusoidal": "560c69664d80df29",
}

# The same for each data source at its defaults (with the default scheme): a key added to one source's config
# changes only its own sources' identities, which the scheme hashes above cannot see.
FIXED_SOURCES = {
    "algorithmic": "bb2254b867e02d34",
    "hf": "285c030f9da11774",
    "passkey": "4ff78d3873b34fc5",
    "stdlib": "64971ef89b6f6e85",
    "tasks": "0becdd5a50783d1d",
    "text": "11dfd4afd562a070",
}


@pytest.mark.parametrize("source", sorted(FIXED_SOURCES))
def test_the_identity_of_each_source_s_defaults_is_what_it_was(source: str) -> None:
    assert set(FIXED_SOURCES) == set(source_registry()), "a new data source: add its identity at its defaults"
    identity = job_identity(Config(data=data_config_class(source)()))
    assert identity_hash(identity) == FIXED_SOURCES[source], (
        f"a new data.* key of {source} changed its sweep jobs' identities: list it in sweep/identity.py ADDED_KEYS"
    )


@pytest.mark.parametrize("scheme", sorted(FIXED))
def test_the_identity_of_the_defaults_is_what_it_was(scheme: str) -> None:
    identity = job_identity(Config(pos=config_class(scheme)()))
    assert identity_hash(identity) == FIXED[scheme], (
        "a new config key changed every sweep job's identity: list it in sweep/identity.py ADDED_KEYS (its default "
        "must do what posenc did before it existed)"
    )
    assert identity_hash(job_identity(Config(), "parent0")) == "3ed54ee730952082"  # an extend job names its parent


def _config_with(key: str) -> Config:
    """A default config whose data source has `key` (a `data.*` key of one source, such as hf's)."""
    group, _, name = key.partition(".")
    if ".params." in key:  # a scaling method's parameter (YaRN's mscale keys): a config that chose YaRN holds it
        return compose_config(["pos=rope", "pos.scaling.method=yarn", "extend.method=yarn"])
    if group == "data":
        for source in source_registry():
            if name in {f.name for f in dataclasses.fields(data_config_class(source))}:
                return Config(data=data_config_class(source)())
    if group == "pos":  # a scheme's own option (FoX's decay times): a config that chose the scheme holds it
        for scheme in scheme_registry():
            if name in {f.name for f in dataclasses.fields(config_class(scheme))}:
                return Config(pos=config_class(scheme)())
    return Config()


@pytest.mark.parametrize("key", ADDED_KEYS)
def test_an_added_key_at_its_default_is_no_part_of_an_identity(key: str) -> None:
    """The value left out is the field's own default (not a second statement of it), and a record planned before the
    key existed (without it) compares equal to today's identity; any other value is part of the identity."""
    cfg = _config_with(key)
    flat = flatten(config_to_dict(cfg))
    assert key in flat, f"ADDED_KEYS lists {key}, a key of no config class"
    assert field_default(key, flat) == flat[key]
    today = job_identity(cfg)
    assert key not in today
    recorded = {k: v for k, v in numbers_keys(flat).items() if k != key}
    assert identity_hash(numbers_keys(recorded)) == identity_hash(today)


def test_an_added_key_set_otherwise_is_part_of_the_identity() -> None:
    cfg = Config(train=TrainConfig(loss_on="answer"))
    assert job_identity(cfg)["train.loss_on"] == "answer"
    assert identity_hash(job_identity(cfg)) != identity_hash(job_identity(Config()))


def test_a_scaling_parameter_default_is_the_chosen_methods() -> None:
    flat = {"extend.method": "yarn", "pos.scaling.method": "none"}
    assert field_default("extend.params.beta_fast", flat) == 32.0
    assert field_default("extend.params.low_freq_factor", {"extend.method": "llama3"}) == 1.0
    assert field_default("pos.base", {"pos.name": "rope"}) == 10000.0


def test_one_list_of_runtime_keys_for_sweeps_and_tables() -> None:
    """Speed and logging settings are left out of a sweep job's identity and of the config identity that groups
    runs as seeds of one experiment, from one list (`config.RUNTIME_KEYS`)."""
    meta = RunMeta.from_json({"step": 1})
    fast = Config(train=TrainConfig(device="cpu", threads=2, compile=True, log_every=7, logger="tensorboard"))
    assert identity_hash(job_identity(fast)) == identity_hash(job_identity(Config()))
    assert config_identity(fast, meta) == config_identity(Config(), meta)
    assert config_identity(Config(train=TrainConfig(seed=3)), meta) == config_identity(Config(), meta)
    assert all(key.startswith("train.") for key in RUNTIME_KEYS)
