"""Registry of positional schemes.

Every module in this package (except `base` and `scaling`) is imported on first use, and each registers its scheme
with `@register`; adding a scheme therefore takes one new file and no edit anywhere else.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TypeVar

from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional.base import PositionalScheme, PositionContext

__all__ = [
    "PositionContext",
    "PositionalScheme",
    "build_scheme",
    "config_class",
    "register",
    "registry",
    "scheme_class",
]

_REGISTRY: dict[str, type[PositionalScheme]] = {}
_NOT_SCHEMES = {"base", "scaling"}
_loaded = False

S = TypeVar("S", bound=type[PositionalScheme])


def register(cls: S) -> S:
    """Class decorator: make `cls` selectable as `pos=<cls.name>`."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise RuntimeError(f"positional scheme '{cls.name}' registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _NOT_SCHEMES and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    _loaded = True


def registry() -> dict[str, type[PositionalScheme]]:
    """All registered schemes by name, in registration-independent (sorted) order."""
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def scheme_class(name: str) -> type[PositionalScheme]:
    schemes = registry()
    if name not in schemes:
        raise ConfigError(f"unknown positional scheme pos={name} (available: {', '.join(schemes)})")
    return schemes[name]


def config_class(name: str) -> type[PosConfig]:
    return scheme_class(name).config_cls


def build_scheme(cfg: PosConfig, model: ModelConfig, train_length: int) -> PositionalScheme:
    """Instantiate the scheme named by `cfg.name` for a model of the given sizes."""
    return scheme_class(cfg.name)(cfg, model, train_length)
