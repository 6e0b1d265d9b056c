"""Registry of RULER-style retrieval tasks (`niah-single`, `niah-multikey`, ..., `variable-tracking`).

Each module of this package except `base` holds one task: how to sample an episode (needles, question, answers) from
a seeded generator. `base` turns an episode into training text (characters) or an evaluation prompt of an exact token
length. Adding a task takes one new file here: the `data=tasks` training mixture (`posenc_cli.sources.tasks`), the
evaluation tasks of `posenc eval-tasks` (`posenc_cli.tasks.retrieval`) and the tests pick it up from this registry.
This package imports neither torch nor the tokenizers (a tokenizer is passed in), so data sources can use it.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TypeVar

from posenc_cli.errors import ConfigError
from posenc_cli.ruler.base import RetrievalTask

__all__ = ["RetrievalTask", "register", "registry", "task_class"]

_REGISTRY: dict[str, type[RetrievalTask]] = {}
_loaded = False

T = TypeVar("T", bound=type[RetrievalTask])


def register(cls: T) -> T:
    """Class decorator: make `cls` a retrieval task named `cls.name`."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise RuntimeError(f"retrieval task '{cls.name}' registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base" and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    _loaded = True


def registry() -> dict[str, type[RetrievalTask]]:
    """All registered retrieval tasks by name, sorted."""
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def task_class(name: str) -> type[RetrievalTask]:
    tasks = registry()
    if name not in tasks:
        raise ConfigError(f"unknown retrieval task '{name}' (available: {', '.join(tasks)})")
    return tasks[name]
