"""The `data=tasks` mixture: its default leaves out the context-filling tasks, and those, when named, grow their
context to the document's length."""

from __future__ import annotations

import pytest

from posenc_cli.data.ruler import registry
from posenc_cli.data.ruler.base import ContextTask
from posenc_cli.data.sources.tasks import ALL_TASKS, TasksDataConfig, corpus_info, make_documents
from posenc_cli.errors import ConfigError


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


def test_each_task_may_have_its_own_longest_episode() -> None:
    """`data.max_len_per_task` bounds each task's episodes by its own length; a mixture without it keeps its
    documents and its fingerprint (`corpus_info` leaves the unset key out)."""
    both = ["niah-single", "variable-tracking"]
    plain = TasksDataConfig(tasks=both, min_len=100, max_len=200, episodes=200)
    own = TasksDataConfig(tasks=both, min_len=100, max_len=200, episodes=200, max_len_per_task=[400, 200])
    own.validate()
    docs = make_documents(own, 200, 0)
    single = [len(d) for d in docs if d.kind == "niah-single"]
    tracking = [len(d) for d in docs if d.kind == "variable-tracking"]
    assert max(single) > 300 and max(tracking) <= 200 + 64  # niah-single to 400, tracking to 200 (and its fixed part)
    assert "max_len_per_task" not in corpus_info(plain, None)
    assert corpus_info(own, None)["max_len_per_task"] == [400, 200]
    assert own.longest == 400 and plain.longest == 200
    for bad in ([400], [50, 200]):  # one per task, none below min_len
        with pytest.raises(ConfigError, match="data.max_len_per_task"):
            TasksDataConfig(tasks=both, min_len=100, max_len=200, max_len_per_task=bad).validate()
