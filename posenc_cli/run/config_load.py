"""Building a run's `Config` from a plain dict (Hydra's composition, or a run's saved `config.yaml`), and dotted
overrides (`train.steps=800`) read into or merged onto such a dict.

The dataclasses live in `config`; this module sits above the registries, which pick the class of the `pos` group
(the scheme's own `PosConfig` subclass) and of the `data` group (the source's own `DataConfig` subclass). It is the
config-loading module: besides `run.config_compose` and `sweep.hydra_bridge` (composition from `configs/`), the
one module that imports OmegaConf (its dotlist grammar, for overrides applied without Hydra).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from typing import Any

from posenc_cli.config import (
    ROOT_CONFIG,
    Config,
    ModelConfig,
    build_dataclass,
    config_dir,
    legacy_eval_options,
    legacy_model_defaults,
    legacy_train_defaults,
    unknown_key_message,
)
from posenc_cli.data.sources import build_data_config
from posenc_cli.data.sources import config_class as data_config_class
from posenc_cli.errors import ConfigError, UserError
from posenc_cli.positional import config_class
from posenc_cli.untrusted import load_yaml


def config_from_dict(raw: dict[str, Any], *, saved: bool = False) -> Config:
    """Validate a plain (resolved) dict and build a `Config`; raises `ConfigError` naming the bad key.

    `saved`: `raw` is a run's config.yaml, whose unset scheme options mean the defaults of the posenc that wrote
    it (`PosConfig.legacy_defaults`); otherwise they take today's defaults (`PosConfig.resolve`).
    """
    if not isinstance(raw, dict):
        raise ConfigError("config must be a mapping")
    raw = dict(raw)
    pos_raw = raw.get("pos", {}) or {}
    if not isinstance(pos_raw, dict):
        raise ConfigError("pos must be a mapping with a 'name'")
    pos_cls = config_class(str(pos_raw.get("name", "nope")))
    pos = build_dataclass(pos_cls, pos_raw, "pos")
    if saved:
        pos.legacy_defaults(build_dataclass(ModelConfig, raw.get("model", {}) or {}, "model"))
        if isinstance(raw.get("model"), dict):
            raw["model"] = legacy_model_defaults(raw["model"])
        if isinstance(raw.get("train"), dict):
            raw["train"] = legacy_train_defaults(raw["train"])
        if isinstance(raw.get("eval"), dict):
            raw["eval"] = legacy_eval_options(raw["eval"])
    raw["pos"] = pos
    raw["data"] = build_data_config(raw.get("data", {}) or {}, drop_foreign=saved)
    cfg = build_dataclass(Config, raw, "")
    cfg.validate()
    return cfg


def unknown_override_message(dotted: str, overrides: Sequence[str]) -> str:
    """`config.unknown_key_message` for an override that names no key, checked against the classes the overrides
    select: `pos=rope pos.bse=500` lists RopeConfig's keys and suggests `pos.base` (the schema alone knows only
    PosConfig's `name`); `data=text` likewise selects the text source's keys."""
    groups: dict[str, type] = {}
    scheme = _chosen(overrides, "pos", "name") or _default_option("pos")
    source = _chosen(overrides, "data", "source") or _default_option("data")
    with contextlib.suppress(UserError):
        if scheme:
            groups["pos"] = config_class(scheme)
    with contextlib.suppress(UserError):
        if source:
            groups["data"] = data_config_class(source)
    return unknown_key_message(dotted, groups)


def _chosen(overrides: Sequence[str], group: str, key: str) -> str | None:
    """The last `group=X` or `group.key=X` among Hydra overrides (with any `+`/`++` prefix)."""
    found = None
    for o in overrides:
        m = re.fullmatch(rf"\+{{0,2}}{group}(?:\.{key})?=([\w.-]+)", o.strip())
        if m:
            found = m.group(1)
    return found


def _default_option(group: str) -> str | None:
    """The option the root config's defaults list picks for `group` (configs/config.yaml: `- pos: rope`)."""
    with contextlib.suppress(UserError):
        root = load_yaml(config_dir() / f"{ROOT_CONFIG}.yaml", what="root config") or {}
        for entry in root.get("defaults", []) if isinstance(root, dict) else []:
            if isinstance(entry, dict) and isinstance(entry.get(group), str):
                return str(entry[group])
    return None


def dotlist_dict(dotted: Sequence[str], *, error_prefix: str = "") -> dict[str, Any]:
    """Dotted overrides (`["data.paths=[a,b]", "train.steps=8"]`) as a nested plain dict, values in OmegaConf's
    dotlist grammar (lists as `[a,b]`, `null`, numbers); a `ConfigError` with OmegaConf's first line (after
    `error_prefix`) for a bad one."""
    # deferred: keeps OmegaConf (Hydra's) off posenc --help start-up
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist(list(dotted)), resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{error_prefix}{str(e).splitlines()[0]}") from e
    assert isinstance(parsed, dict)
    return parsed  # type: ignore[return-value]


def merge_dotlist(base: dict[str, Any], dotted: Sequence[str]) -> dict[str, Any]:
    """`base` (a config as a plain dict) with dotted overrides set on top, as OmegaConf merges them (a key `base`
    lacks is added, a value is parsed in the dotlist grammar); a `ConfigError` with OmegaConf's first line."""
    # deferred: keeps OmegaConf (Hydra's) off posenc --help start-up
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        merged = OmegaConf.merge(OmegaConf.create(base), OmegaConf.from_dotlist(list(dotted)))
        raw = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError(str(e).splitlines()[0]) from e
    assert isinstance(raw, dict)
    return raw  # type: ignore[return-value]
