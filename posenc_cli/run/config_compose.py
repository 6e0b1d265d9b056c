"""Composing a run's config with Hydra: `configs/` plus overrides (`pos=alibi train.steps=600`) into a `Config`.

Every command that takes overrides composes here; sweeps add Hydra's multirun on top (`sweep.hydra_bridge`). Each
group's options are generated from the dataclasses (`register_groups`): a scheme or a data source is a `pos`/`data`
option by being registered, and a group file in `configs/` starts from its dataclass's defaults (its defaults list
names `/dataclass/<group>`) and states only what differs. The composed dict goes to `config_load.config_from_dict`,
which checks keys, types and ranges; beside it, this is the module that imports Hydra for single runs.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc_cli.config import ROOT_CONFIG, Config, config_dir, suggest
from posenc_cli.data.sources import registry as source_registry
from posenc_cli.errors import ConfigError
from posenc_cli.positional import registry
from posenc_cli.rope_scaling import ScalingSettings
from posenc_cli.run.config_load import config_from_dict, unknown_override_message

BASE_GROUP = "dataclass"  # `/dataclass/model` is ModelConfig's defaults; `/dataclass/data/<source>` a source's


def group_classes() -> dict[str, type]:
    """The groups whose options are one dataclass each (`model`, `tokenizer`, `train`, `eval`, `extend`); `pos` and
    `data` take their class from the option (the scheme's or source's own config class)."""
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config) if f.name not in ("pos", "data")}


def default_node(obj: Any) -> dict[str, Any]:
    """Dataclass `obj` as the plain mapping a Hydra group node holds: its fields, nested dataclasses as mappings,
    and a RoPE scaling's `params` empty (the chosen method's own defaults fill them, so `extend.method=llama3` does
    not inherit YaRN's parameters; one is added with `+extend.params.beta_fast=16`)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(obj, ScalingSettings) and f.name == "params":
            out[f.name] = {}
        elif dataclasses.is_dataclass(value):
            out[f.name] = default_node(value)
        else:
            out[f.name] = copy.deepcopy(value)
    return out


def base_nodes() -> dict[str, dict[str, Any]]:
    """Each group's dataclass defaults by their path in Hydra's ConfigStore (`dataclass/model`,
    `dataclass/data/text`, ...), what a group file's defaults list starts from."""
    nodes = {f"{BASE_GROUP}/{group}": default_node(cls()) for group, cls in group_classes().items()}
    for name, source in source_registry().items():
        nodes[f"{BASE_GROUP}/data/{name}"] = default_node(source.config_cls(source=name))
    return nodes


def register_groups() -> None:
    """Store the nodes generated from the dataclasses in Hydra's ConfigStore: every registered scheme as a `pos`
    option and every registered data source as a `data` option (a new scheme or source is one file; a group file in
    `configs/data/` takes the source's place), and each group's defaults (`base_nodes`), which the group files in
    `configs/` start from. Stored as plain mappings: OmegaConf's structured configs cannot type `Literal` fields;
    `config_from_dict` checks types and keys after composition."""
    # deferred: keeps Hydra off posenc --help start-up
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, cls in registry().items():
        store.store(group="pos", name=name, node=default_node(cls.config_cls(name=name)))
    for name, source in source_registry().items():
        if not (config_dir() / "data" / f"{name}.yaml").is_file():
            store.store(group="data", name=name, node=default_node(source.config_cls(source=name)))
    for path, node in base_nodes().items():
        group, _, name = path.rpartition("/")
        store.store(group=group, name=name, node=node)


def searchpath_override(user_dir: Path | None) -> list[str]:
    """Hydra's override that adds a user's `--config-dir` to the search path (none without one)."""
    if user_dir is None:
        return []
    user_dir = Path(user_dir).resolve()
    if not user_dir.is_dir():
        raise ConfigError(f"--config-dir {user_dir} is not a directory")
    return [f"hydra.searchpath=[file://{user_dir}]"]


def check_override_list(overrides: Sequence[str] | str) -> list[str]:
    """`overrides` as a list; one line for one string holding them all (`"pos=rope train.steps=10"`), which Hydra
    would read as one override (or, split into characters, as "missing EQUAL at '<EOF>'")."""
    if isinstance(overrides, str):
        example = overrides.split() or ["pos=rope", "train.steps=10"]
        raise ConfigError(f"overrides are a list of strings, one per setting ({example!r}), not one string")
    out = list(overrides)
    for item in out:
        if not isinstance(item, str):
            raise ConfigError(f"overrides are a list of strings such as 'train.steps=10', got {item!r}")
        if _SEVERAL.match(item):
            raise ConfigError(f"override {item!r} holds several settings; give one per string: {item.split()!r}")
    return out


_SEVERAL = re.compile(r"[+~]{0,2}[\w./@-]+=\S*\s+[+~]{0,2}[\w./@-]+=")  # "pos=rope train.steps=10"


def compose_dict(overrides: Sequence[str], user_config_dir: Path | None = None) -> dict[str, Any]:
    """Compose the root config with Hydra overrides into a plain, resolved dict (no `hydra` key)."""
    # deferred: keeps Hydra and OmegaConf (Hydra's) off posenc --help start-up
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    overrides = check_override_list(overrides)
    register_groups()
    all_overrides = [*overrides, *searchpath_override(user_config_dir)]
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
            cfg = compose(config_name=ROOT_CONFIG, overrides=all_overrides)
        raw = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        match = re.match(r"Could not override '([^']+)'.\s+To append", str(e))
        if match:  # checked against the scheme and source the overrides select (pos=rope pos.bse: RopeConfig's keys)
            raise ConfigError(unknown_override_message(match.group(1), overrides)) from e
        raise ConfigError(_suggest_option(one_line(e))) from e
    assert isinstance(raw, dict)
    raw.pop("hydra", None)
    return raw


def compose_config(overrides: Sequence[str], user_config_dir: Path | None = None) -> Config:
    """Compose and validate: the `Config` a command runs with."""
    return config_from_dict(compose_dict(overrides, user_config_dir))


def _suggest_option(text: str) -> str:
    """ "Could not find 'pos/alibii' (available: alibi, ...)" gains " (did you mean alibi?)" after the option."""
    missing = re.search(r"Could not find '(?:[^']*/)?([^'/]+)'.*\(available: ([^)]*)\)", text)
    if not missing:
        return text
    hint = suggest(missing.group(1), [o.strip() for o in missing.group(2).split(",")])
    return text[: missing.end(1) + 1] + hint + text[missing.end(1) + 1 :]


def one_line(exc: BaseException) -> str:
    """Hydra/OmegaConf errors span several lines with hints and search paths: keep what names the problem."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    parts = [lines[0]]
    options: list[str] = []
    in_options = False
    for ln in lines[1:]:
        if ln.startswith(("Config search path", "See https", "provider=")):
            in_options = False
            continue
        if ln.startswith("Available options"):
            in_options = True
            continue
        if in_options:
            options.append(ln)
        elif ln.startswith(("Key '", "full_key:", "missing ", "no viable")):
            parts.append(ln)
    text = " ".join(parts)
    if options:
        text += f" (available: {', '.join(options)})"
    return text
