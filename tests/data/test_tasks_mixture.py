"""The `data=tasks` mixture: its default leaves out the context-filling tasks, and those, when named, grow their
context to the document's length."""

from __future__ import annotations

from posenc_cli.data.ruler import registry
from posenc_cli.data.ruler.base import ContextTask
from posenc_cli.data.sources.tasks import ALL_TASKS, TasksDataConfig, make_documents


def test_the_default_mixture_has_the_short_tasks_only() -> None:
    filling = {n for n, t in registry().items() if issubclass(t, ContextTask)}
    assert {"common-words", "frequent-words", "kv-retrieval"} <= filling
    assert set(ALL_TASKS) == set(registry()) - filling and ALL_TASKS
    assert TasksDataConfig().tasks == list(ALL_TASKS)


def test_a_context_task_fills_the_document_length() -> None:
    short = make_documents(TasksDataConfig(tasks=["kv-retrieval"], min_len=64, max_len=64), 20, 0)
    long = make_documents(TasksDataConfig(tasks=["kv-retrieval"], min_len=1024, max_len=1024), 20, 0)
    pairs = [d.count('": "') for d in long]  # key-value pairs in the JSON context
    assert min(pairs) > 4 * max(d.count('": "') for d in short)  # not the smallest episode padded with filler
    assert all(len(d) <= 1024 + 64 for d in long)  # about the asked length, not far beyond it
