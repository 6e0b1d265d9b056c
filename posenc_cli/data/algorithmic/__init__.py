"""Registry of the algorithmic length-generalisation tasks of Kazemnejad et al. 2023 (`copy`, `reverse`, `addition`,
`sorting`, `summation`, `parity`, `polynomial`; `suite` "length-generalization") and of the synthetic tasks of the
2024-26 positional papers (issue #44, `suite` "synthetic": `mqar`, `flipflop` with its `_sparse` and `_dense`
splits, the word problems `s5` and `a5`, and the Chomsky-hierarchy tasks `even_pairs`, `cycle_navigation`,
`modular_arithmetic`, `stack_manipulation`, `bucket_sort`, `missing_duplicate`, `binary_addition`,
`duplicate_string`; docs/commands/synthetic-tasks.md).

Each module of this package except `base` holds one task: a seeded generator of one example (prompt and answer) of a
given instance length, and an independent solver that reads the answer off the prompt (what the contract test
`tests/data/test_algorithmic_contract.py` checks on every registered task). The `data=algorithmic` training source
(`posenc_cli.data.sources.algorithmic`), `posenc eval-algorithmic` (`posenc_cli.evaluation.algorithmic`) and the
tests pick a new task file up from this registry with no other edit. Imports neither torch nor the tokenizers.
"""

from __future__ import annotations

import difflib

from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example
from posenc_cli.errors import ConfigError
from posenc_cli.registry import Registry

__all__ = [
    "AlgorithmicTask",
    "Example",
    "in_distribution_lengths",
    "paper_tasks",
    "register",
    "registry",
    "task_class",
]

_TASKS: Registry[type[AlgorithmicTask]] = Registry(__name__, "algorithmic task")
register = _TASKS.register  # class decorator: make `cls` an algorithmic task named `cls.name`


def registry() -> dict[str, type[AlgorithmicTask]]:
    """All registered algorithmic tasks by name, sorted."""
    return _TASKS.entries()


def paper_tasks() -> list[str]:
    """The NoPE paper's tasks (`suite` "length-generalization"), sorted: the default mixture of `data=algorithmic` and
    of `eval-algorithmic` on a run not trained on algorithmic data. The synthetic tasks are chosen by name."""
    return [name for name, cls in registry().items() if cls.suite == "length-generalization"]


def task_class(name: str, what: str = "algorithmic task") -> type[AlgorithmicTask]:
    """The task registered as `name`; else one `ConfigError` line with the closest name ("did you mean")."""
    entries = registry()
    if name in entries:
        return entries[name]
    close = difflib.get_close_matches(str(name), list(entries), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise ConfigError(f"unknown {what} '{name}'{hint} (available: {', '.join(entries)})")


def in_distribution_lengths(task: str, max_length: int, min_length: int | None = None) -> tuple[int, int]:
    """[low, high] instance lengths of `task` that training draws, i.e. its in-distribution lengths: from
    `min_length` (None: the task's builder default `train_min`, capped at `max_length`; never below the task's
    `min_length`) to `max_length` = L. Training (`data.sources.algorithmic`) and the evaluation's means both read it."""
    cls = task_class(task)
    low = min(cls.train_min, max_length) if min_length is None else min_length
    low = max(low, cls.min_length)
    return low, max(low, max_length)
