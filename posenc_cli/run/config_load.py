"""Building a run's `Config` from a plain dict (Hydra's composition, or a run's saved `config.yaml`).

The dataclasses live in `config`; this module sits above the registries, which pick the class of the `pos` group
(the scheme's own `PosConfig` subclass) and of the `data` group (the source's own `DataConfig` subclass).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc_cli.config import ROOT_CONFIG, Config, ModelConfig, build_dataclass, config_dir, unknown_key_message
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


def load_config_file(path: Path) -> Config:
    """Read a resolved `config.yaml` (safe YAML only) and validate it."""
    raw = load_yaml(path, what="config file")
    try:
        return config_from_dict(raw, saved=True)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
