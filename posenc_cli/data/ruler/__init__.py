"""Registry of RULER-style retrieval tasks (`niah-single`, `niah-multikey`, ..., `variable-tracking`).

Each module of this package except `base` holds one task: how to sample an episode (needles, question, answers) from
a seeded generator. `base` turns an episode into training text (characters) or an evaluation prompt of an exact token
length. Adding a task takes one new file here: the `data=tasks` training mixture (`posenc_cli.data.sources.tasks`), the
evaluation tasks of `posenc eval-tasks` (`posenc_cli.evaluation.tasks.retrieval`) and the tests pick it up from this
registry.
This package imports neither torch nor the tokenizers (a tokenizer is passed in), so data sources can use it.
"""

from __future__ import annotations

from posenc_cli.data.ruler.base import RetrievalTask
from posenc_cli.registry import Registry

__all__ = ["RetrievalTask", "register", "registry", "task_class"]

_TASKS: Registry[type[RetrievalTask]] = Registry(__name__, "retrieval task")
register = _TASKS.register  # class decorator: make `cls` a retrieval task named `cls.name`


def registry() -> dict[str, type[RetrievalTask]]:
    """All registered retrieval tasks by name, sorted."""
    return _TASKS.entries()


def task_class(name: str) -> type[RetrievalTask]:
    return _TASKS.get(name, "unknown retrieval task '{name}' (available: {available})")
