"""Registry of positional schemes.

Every module in this package (except `base` and `scaling`) is imported on first use, and each registers its scheme
with `@register`; adding a scheme therefore takes one new file and no edit anywhere else.
"""

from __future__ import annotations

from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.positional.base import PositionalScheme, PositionContext
from posenc_cli.registry import Registry

__all__ = [
    "PositionContext",
    "PositionalScheme",
    "build_scheme",
    "config_class",
    "register",
    "registry",
    "scheme_class",
]

_SCHEMES: Registry[type[PositionalScheme]] = Registry(__name__, "positional scheme", skip=("base",))
register = _SCHEMES.register  # class decorator: make a scheme selectable as `pos=<cls.name>`


def registry() -> dict[str, type[PositionalScheme]]:
    """All registered schemes by name, in registration-independent (sorted) order."""
    return _SCHEMES.entries()


def scheme_class(name: str) -> type[PositionalScheme]:
    return _SCHEMES.get(name, "unknown positional scheme pos={name} (available: {available})")


def config_class(name: str) -> type[PosConfig]:
    return scheme_class(name).config_cls


def build_scheme(cfg: PosConfig, model: ModelConfig, train_length: int) -> PositionalScheme:
    """Instantiate the scheme named by `cfg.name` for a model of the given sizes."""
    return scheme_class(cfg.name)(cfg, model, train_length)
