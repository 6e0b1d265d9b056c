"""Building a run's `Config` from a plain dict (Hydra's composition, or a run's saved `config.yaml`).

The dataclasses live in `config`; this module sits above the registries, which pick the class of the `pos` group
(the scheme's own `PosConfig` subclass) and of the `data` group (the source's own `DataConfig` subclass).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from posenc_cli.config import Config, ModelConfig, build_dataclass
from posenc_cli.data.sources import build_data_config
from posenc_cli.errors import ConfigError
from posenc_cli.positional import config_class


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


def load_config_file(path: Path) -> Config:
    """Read a resolved `config.yaml` (safe YAML only) and validate it."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"config file not found: {path}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from e
    try:
        return config_from_dict(raw, saved=True)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
