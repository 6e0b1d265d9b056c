"""Is the machine already busy? A check before training or sweeping on the CPU.

Threads that outnumber the free cores slow each other down far more than they add: with one of two cores taken by
another process, a 2-thread run measured 1–6k tokens/s where `train.threads=1` measured 7–11k (issue #17). The
decision is a pure function of the 1-minute load average (`os.getloadavg`), the cores and the threads we would
start, so it can be tested without a busy machine.
"""

from __future__ import annotations

import math
import os

import torch

SLACK = 0.5  # load-average noise (a shell, an editor) that does not count as another process's work


def busy_warning(load: float, cores: int, threads: int, jobs: int = 1) -> str | None:
    """One line when `jobs` × `threads` threads would share cores that other processes already load, else None.

    `load` is the 1-minute load average before we start; `threads` is per job.
    """
    wanted = max(1, threads) * max(1, jobs)
    free = cores - load
    if load < SLACK or wanted <= free + SLACK:
        return None
    fit = max(1, math.floor(free + SLACK))
    advice = f"train.threads={max(1, fit // max(1, jobs))}"
    if jobs > 1:
        advice += f" or fewer parallel jobs (hydra.launcher.n_jobs={max(1, fit // max(1, threads))})"
    return (
        f"this machine is busy: other processes already load {load:.1f} of its {cores} cores, and {wanted} more "
        f"threads would compete with them (slower than using fewer); consider {advice}"
    )


def machine_busy_warning(threads: int, jobs: int = 1) -> str | None:
    """`busy_warning` for this machine now (None where the load average is unavailable, e.g. Windows)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    return busy_warning(load, os.cpu_count() or 1, threads, jobs)


def training_busy_warning(device: str, threads: int, jobs: int = 1) -> str | None:
    """The check for a training run or a sweep's local jobs on `device` with `train.threads` (0: torch's default,
    or cores ÷ jobs as posenc gives parallel sweep jobs); None on an accelerator."""
    if device in ("cuda", "mps") or (
        device == "auto" and (torch.cuda.is_available() or torch.backends.mps.is_available())
    ):
        return None
    if threads <= 0:
        threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else torch.get_num_threads()
    return machine_busy_warning(threads, jobs)
