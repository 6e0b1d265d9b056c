"""Registry of data sources (`data=stdlib|text|hf|passkey`).

Every module of this package except `base` and `_`-prefixed helpers is imported on first use, and each registers its
`DataSource` with `@register`; adding a data source therefore takes one new file (its config dataclass and source
class) and no edit anywhere else: `data=<name>` composes from the class's defaults. A `configs/data/<name>.yaml`
group file is optional documentation of the same defaults (a contract test holds them equal).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from posenc_cli.config import DataConfig, build_dataclass
from posenc_cli.data.sources.base import DataSource, ProgressFn, Source
from posenc_cli.errors import ConfigError
from posenc_cli.registry import Registry

__all__ = [
    "DataSource",
    "build_data_config",
    "config_class",
    "open_source",
    "register",
    "registry",
    "source_class",
]

_SOURCES: Registry[type[DataSource]] = Registry(__name__, "data source")
register = _SOURCES.register  # class decorator: make a source selectable as `data.source=<cls.name>`


def registry() -> dict[str, type[DataSource]]:
    """All registered data sources by name, sorted."""
    return _SOURCES.entries()


def source_class(name: str) -> type[DataSource]:
    return _SOURCES.get(name, "data.source={name!r} is not one of {available}")


def config_class(name: str) -> type[DataConfig]:
    return source_class(name).config_cls


def build_data_config(raw: Any, *, drop_foreign: bool = False) -> DataConfig:
    """The typed config of the source `raw['source']` names (default stdlib); raises `ConfigError` naming a bad key.

    `drop_foreign`: drop the keys of other sources instead of refusing them. For a run's saved config.yaml: before
    each source had its own class, every source's config held every source's keys (hub fields, `passkey_*`), which
    that source ignored.
    """
    if dataclasses.is_dataclass(raw) and isinstance(raw, DataConfig):
        return raw
    if not isinstance(raw, dict):
        raise ConfigError(f"data: expected a mapping, got {raw!r}")
    source = raw.get("source", DataConfig.source)
    cls = config_class(str(source))
    if drop_foreign:
        own = {f.name for f in dataclasses.fields(cls)}
        foreign = {f.name for other in registry().values() for f in dataclasses.fields(other.config_cls)} - own
        raw = {k: v for k, v in raw.items() if k not in foreign}
    return build_dataclass(cls, raw, "data")


def open_source(data: DataConfig, root: Path, progress: ProgressFn | None) -> Source:
    """Open the corpus of `data` (fingerprint and summary now; documents when the token cache asks)."""
    return source_class(data.source).open(data, root, progress)
