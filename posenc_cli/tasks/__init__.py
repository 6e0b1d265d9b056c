"""Registry of evaluation tasks (`extrapolate`, `passkey`, ...).

Every module of this package except `base` and `_`-prefixed helpers is imported on first use, and each registers its
`EvalTask` with `@register`. A data source names the tasks a sweep job trained on it runs (`DataSource.tasks`), so
adding a task takes one new file (plus its source's `tasks`) and no edit in the sweep.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TypeVar

from posenc_cli.errors import ConfigError
from posenc_cli.tasks.base import EvalTask

__all__ = ["EvalTask", "register", "registry", "task_class"]

_REGISTRY: dict[str, type[EvalTask]] = {}
_NOT_TASKS = {"base"}
_loaded = False

T = TypeVar("T", bound=type[EvalTask])


def register(cls: T) -> T:
    """Class decorator: make `cls` an evaluation task named `cls.name`."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise RuntimeError(f"evaluation task '{cls.name}' registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _NOT_TASKS and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    _loaded = True


def registry() -> dict[str, type[EvalTask]]:
    """All registered evaluation tasks by name, sorted."""
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def task_class(name: str) -> type[EvalTask]:
    tasks = registry()
    if name not in tasks:
        raise ConfigError(f"unknown evaluation task '{name}' (available: {', '.join(tasks)})")
    return tasks[name]
