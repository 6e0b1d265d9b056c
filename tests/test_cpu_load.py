"""The busy-machine warning as a pure decision: load, cores, threads and parallel jobs."""

from __future__ import annotations

import os

import pytest

from posenc_cli.cpu_load import busy_warning, default_threads, free_cores, machine_busy_warning


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


def test_a_run_already_at_one_thread_is_not_told_to_use_one() -> None:
    text = busy_warning(2.5, cores=2, threads=1)
    assert text is not None and "train.threads" not in text and "1 more thread would" in text
    jobs = busy_warning(3.0, cores=4, threads=1, jobs=2)  # one free core for two 1-thread jobs: fewer jobs only
    assert jobs is not None and "train.threads" not in jobs and "hydra.launcher.n_jobs=1" in jobs


@pytest.mark.parametrize(
    ("load", "cores", "free"),
    [(None, 8, 8), (0.2, 2, 2), (1.0, 2, 1), (1.2, 4, 3), (0.9, 2, 1), (2.5, 2, 1), (7.0, 16, 9)],
)
def test_free_cores_count_what_other_processes_leave(load: float | None, cores: int, free: int) -> None:
    assert free_cores(load, cores) == free


@pytest.mark.parametrize(
    ("free", "ceiling", "jobs", "threads"),
    [(2, 2, 1, 2), (1, 2, 1, 1), (16, 8, 1, 8), (3, 8, 1, 3), (8, 16, 2, 4), (3, 16, 2, 1), (1, 16, 4, 1)],
)
def test_default_threads_take_the_free_cores_shared_by_jobs(free: int, ceiling: int, jobs: int, threads: int) -> None:
    """Never more threads than free cores (nor than torch's default); parallel jobs divide them."""
    assert default_threads(free, ceiling, jobs) == threads


def test_the_default_on_a_machine_with_one_busy_core_never_warns() -> None:
    """The case of issue #42: one of two cores busy; the default (1 thread) does not compete."""
    threads = default_threads(free_cores(1.0, 2), ceiling=2)
    assert threads == 1 and busy_warning(1.0, cores=2, threads=threads) is None
