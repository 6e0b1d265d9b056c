"""Registry of evaluation tasks (`extrapolate`, `passkey`, ...).

Every module of this package except `base` and `_`-prefixed helpers is imported on first use, and each registers its
`EvalTask` with `@register`. A data source names the tasks a sweep job trained on it runs (`DataSource.tasks`), so
adding a task takes one new file (plus its source's `tasks`) and no edit in the sweep; a sweep's end, `compare` and
the API print and return every registered task's summary (`EvalTask.summarise`, `api.task_summaries`).
"""

from __future__ import annotations

from posenc_cli.evaluation.tasks.base import EvalTask
from posenc_cli.registry import Registry

__all__ = ["EvalTask", "register", "registry", "task_class"]

_TASKS: Registry[type[EvalTask]] = Registry(__name__, "evaluation task")
register = _TASKS.register  # class decorator: make `cls` an evaluation task named `cls.name`


def registry() -> dict[str, type[EvalTask]]:
    """All registered evaluation tasks by name, sorted."""
    return _TASKS.entries()


def task_class(name: str) -> type[EvalTask]:
    return _TASKS.get(name, "unknown evaluation task '{name}' (available: {available})")
