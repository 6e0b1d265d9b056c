"""Shared test setup: one thread per test worker, no writes outside tmp dirs, headless plots."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
# Rich sizes its consoles from COLUMNS when stdout is not a terminal (CI, xdist workers): keep tables unwrapped.
os.environ["COLUMNS"] = "200"


def pytest_configure(config: pytest.Config) -> None:
    # Parallel workers must share the cores, not fight for them: one intra-op thread per worker.
    import torch

    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Token caches go to a session temp dir unless a test sets POSENC_CACHE_DIR itself."""
    if "POSENC_CACHE_DIR" not in os.environ:
        os.environ["POSENC_CACHE_DIR"] = str(tmp_path_factory.mktemp("posenc-cache"))
