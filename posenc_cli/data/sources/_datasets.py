"""Reading `datasets` tables (shared by `data=text` and `data=hf`): quiet progress bars, one scan for sizes/scores."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from posenc_cli.data.sources.base import ProgressFn, Table, hash_unit, report_progress


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """Silence `datasets`' own progress bars while it reads local files (the CLI shows its own)."""
    # deferred: keeps datasets off posenc --help start-up
    import datasets
    from datasets.utils import logging as ds_logging

    was_enabled = not datasets.are_progress_bars_disabled()
    verbosity = ds_logging.get_verbosity()
    datasets.disable_progress_bars()
    ds_logging.set_verbosity_error()
    try:
        yield
    finally:
        ds_logging.set_verbosity(verbosity)
        if was_enabled:
            datasets.enable_progress_bars()


def scan_dataset(ds: Any, column: str, progress: ProgressFn | None) -> Table:
    """Read a `datasets.Dataset` column once for document sizes and content-hash scores."""
    col = ds.select_columns([column])
    sizes: list[int] = []
    scores: list[float] = []
    for batch in col.iter(batch_size=1000):
        for text in batch[column]:
            raw = (text or "").encode("utf-8")
            sizes.append(len(raw))
            scores.append(hash_unit(raw))
        report_progress(progress, "reading", len(sizes), col.num_rows)

    def read() -> Iterator[list[str]]:
        for batch in col.iter(batch_size=1000):
            yield [t or "" for t in batch[column]]

    return Table(read=read, sizes=np.array(sizes, dtype=np.int64), scores=np.array(scores, dtype=np.float64))
