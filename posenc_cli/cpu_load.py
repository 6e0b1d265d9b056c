"""Is the machine already busy? A check before training or sweeping on the CPU.

Threads that outnumber the free cores slow each other down far more than they add: with one of two cores taken by
another process, a 2-thread run measured 1–6k tokens/s where `train.threads=1` measured 7–11k (issue #17). The
decision is a pure function of the 1-minute load average (`os.getloadavg`), the cores and the threads we would
start, so it can be tested without a busy machine.

The default thread count follows the same measurement (`default_threads`): `train.threads=0` (training, evaluation,
a sweep's jobs) takes the cores other processes leave free, never more than torch's own default, divided among a
sweep's parallel jobs; the load is read once per process (`free_cores_now`; a sweep reads it before launching its
jobs and passes it on), as posenc's own threads soon count in the load average.
"""

from __future__ import annotations

import functools
import math
import os

import torch

SLACK = 0.5  # load-average noise (a shell, an editor) that does not count as another process's work


def free_cores(load: float | None, cores: int) -> int:
    """Cores other processes leave free (at least 1): all of them on an idle machine (`load` < SLACK, or None where
    the load average is unavailable), else floor(cores − load + SLACK), as `busy_warning` counts them."""
    if load is None or load < SLACK:
        return max(1, cores)
    return max(1, min(cores, math.floor(cores - load + SLACK)))


def default_threads(free: int, ceiling: int, jobs: int = 1) -> int:
    """Threads per job for `train.threads=0`: the `free` cores, at most `ceiling` (torch's default, one per physical
    core, or what OMP_NUM_THREADS set), shared by `jobs` parallel jobs; at least 1."""
    return max(1, min(free, ceiling) // max(1, jobs))


def load_average() -> float | None:
    """The 1-minute load average (None where unavailable, e.g. Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


@functools.cache
def free_cores_now() -> int:
    """`free_cores` of this machine, measured the first time it is asked in this process."""
    return free_cores(load_average(), os.cpu_count() or 1)


def busy_warning(load: float, cores: int, threads: int, jobs: int = 1) -> str | None:
    """One line when `jobs` × `threads` threads would share cores that other processes already load, else None.

    `load` is the 1-minute load average before we start; `threads` is per job.
    """
    threads, jobs = max(1, threads), max(1, jobs)
    wanted = threads * jobs
    free = cores - load
    if load < SLACK or wanted <= free + SLACK:
        return None
    fit = max(1, math.floor(free + SLACK))
    advice = []  # only what would lower the threads: a run already at 1 thread is not told to use 1
    if (fewer := max(1, fit // jobs)) < threads:
        advice.append(f"train.threads={fewer}")
    if jobs > 1 and (fewer_jobs := max(1, fit // threads)) < jobs:
        advice.append(f"fewer parallel jobs (hydra.launcher.n_jobs={fewer_jobs})")
    tail = f"consider {' or '.join(advice)}" if advice else "expect it to run slower than on an idle machine"
    return (
        f"this machine is busy: other processes already load {load:.1f} of its {cores} cores, and {wanted} more "
        f"thread{'s' if wanted != 1 else ''} would compete with them (slower than using fewer); {tail}"
    )


def machine_busy_warning(threads: int, jobs: int = 1) -> str | None:
    """`busy_warning` for this machine now (None where the load average is unavailable, e.g. Windows)."""
    load = load_average()
    return None if load is None else busy_warning(load, os.cpu_count() or 1, threads, jobs)


def training_busy_warning(device: str, threads: int, jobs: int = 1) -> str | None:
    """The check for a training run or a sweep's local jobs on `device` with `train.threads` (0: `default_threads`,
    the free cores ÷ jobs, which never compete); None on an accelerator."""
    if device in ("cuda", "mps") or (
        device == "auto" and (torch.cuda.is_available() or torch.backends.mps.is_available())
    ):
        return None
    if threads <= 0:
        threads = default_threads(free_cores_now(), torch.get_num_threads(), jobs)
    return machine_busy_warning(threads, jobs)
