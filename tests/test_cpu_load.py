"""The busy-machine warning as a pure decision: load, cores, threads and parallel jobs."""

from __future__ import annotations

import os

import pytest

from posenc_cli.cpu_load import busy_warning, machine_busy_warning


def test_idle_machine_or_enough_free_cores_gives_no_warning() -> None:
    assert busy_warning(0.1, cores=2, threads=2) is None
    assert busy_warning(0.3, cores=2, threads=2) is None  # background noise
    assert busy_warning(1.0, cores=8, threads=4) is None  # 7 free cores for 4 threads


def test_one_core_taken_on_two_suggests_one_thread() -> None:
    # The case measured in issue #17: another process on one of two cores, posenc's default two threads.
    text = busy_warning(1.0, cores=2, threads=2)
    assert text is not None and "train.threads=1" in text and "1.0 of its 2 cores" in text


def test_parallel_jobs_suggest_fewer_jobs_too() -> None:
    text = busy_warning(2.0, cores=4, threads=2, jobs=2)
    assert text is not None and "train.threads=1" in text and "hydra.launcher.n_jobs=1" in text
    assert busy_warning(0.0, cores=4, threads=2, jobs=2) is None


def test_fully_loaded_machine_still_suggests_one_thread() -> None:
    text = busy_warning(6.0, cores=4, threads=4)
    assert text is not None and "train.threads=1" in text


def test_machine_check_reads_the_load_average(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert machine_busy_warning(threads=2) is not None
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert machine_busy_warning(threads=2) is None
