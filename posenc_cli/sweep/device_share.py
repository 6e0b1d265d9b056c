"""Jobs of one sweep sharing one GPU (`hydra/launcher=joblib hydra.launcher.n_jobs=N`): each job waits for the
device memory it needs before it starts, so N jobs that do not fit run as many as fit instead of crashing mid-run.

How: the jobs on a device start one at a time. A starting job holds the device's start lock (a file in the sweep
directory), waits until the device's free memory (`torch.cuda.mem_get_info`, what every process on the device left
free) covers its estimate (`job_need_bytes`), and keeps the lock until its first training step is done: by then its
memory is allocated and the next job's check sees it. A job still waiting after `wait_seconds()` fails with a
one-line reason in its failed.json (`NotEnoughDeviceMemory`), and a re-run of the sweep runs it. On a CPU, or with
one job at a time, nothing is checked.

What the estimate leaves out: the later evaluation of a running job may need more than its training did (long
lengths), so jobs that fit at their start can still run out of memory; such a job fails with a one-line reason
(`oom_reason`) naming n_jobs, and a re-run resumes it from its checkpoint.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout

from posenc_cli.config import Config
from posenc_cli.errors import UserError
from posenc_cli.run.device import resolve_device
from posenc_cli.run.memory import (
    TRAIN_BYTES_PER_PARAM,
    approx_params,
    gib,
    micro_batch_bytes,
    planned_vocab_size,
    validation_bytes,
)

WAIT_ENV = "POSENC_GPU_WAIT_S"  # how long a job waits for device memory (and for the jobs starting before it)
DEFAULT_WAIT_S = 600.0
POLL_S = 5.0
# What a process holds on a GPU besides its tensors: the CUDA context, cuBLAS/cuDNN workspaces (a few hundred MiB
# on recent GPUs; rounded up to 1 GiB), and a factor on the activation estimate, which is a lower bound (no attention
# scores, no allocator fragmentation: see posenc_cli.run.memory.micro_batch_bytes).
CONTEXT_BYTES = 2**30
ACTIVATION_HEADROOM = 2


class NotEnoughDeviceMemory(UserError):
    """A sweep job could not start: the device did not have the memory it needs free within the wait."""


def wait_seconds() -> float:
    """`$POSENC_GPU_WAIT_S` (seconds, >= 0), else `DEFAULT_WAIT_S`."""
    raw = os.environ.get(WAIT_ENV, "")
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_WAIT_S
    except ValueError:
        return DEFAULT_WAIT_S


def job_need_bytes(cfg: Config) -> int:
    """An estimate of the device memory a job's training needs: the CUDA context, weights + gradients + AdamW
    moments, `ACTIVATION_HEADROOM` × a micro-batch's activations, and the validation windows."""
    tc, vocab = cfg.train, planned_vocab_size(cfg)
    n_params = approx_params(cfg.model, vocab, tc.seq_len if cfg.pos.name == "learned" else 0)
    micro = micro_batch_bytes(cfg.model, vocab, tc.batch_size, tc.seq_len)
    windows = validation_bytes(tc.batch_size, tc.seq_len, tc.eval_batches)
    return CONTEXT_BYTES + n_params * TRAIN_BYTES_PER_PARAM + ACTIVATION_HEADROOM * micro + windows


def job_threads(parallel_jobs: int, cores: int, free: int | None = None) -> int:
    """CPU threads per job when `parallel_jobs` run at once (joblib's n_jobs: a count, or negative: cores + 1 +
    n_jobs, so -1 is one job per core), so that the jobs together use the `free` cores (default: all `cores`;
    `cpu_load.free_cores`) once, on a GPU too (each job's launches, sampling and compilation are CPU work)."""
    jobs = parallel_jobs if parallel_jobs > 0 else cores + 1 + parallel_jobs
    return max(1, min(cores, cores if free is None else free) // max(1, jobs))


def device_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of `device` (the seam tests replace with a fake device)."""
    return torch.cuda.mem_get_info(device)


def _release_own_cache(device: torch.device) -> None:
    """Return the memory this process cached for an earlier job (joblib reuses its workers), so it counts as free."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


_sleep: Callable[[float], None] = time.sleep
_clock: Callable[[], float] = time.monotonic


@contextlib.contextmanager
def start_slot(
    cfg: Config, sweep_dir: Path, parallel_jobs: int, say: Callable[[str], None] = print
) -> Iterator[Callable[[], None]]:
    """Wait (bounded) until the job fits on its device, holding the device's start lock; yields `release`, which
    the job calls after its first training step (the lock is released on exit in any case). A no-op yielding a
    no-op unless several jobs run at once on a CUDA device."""
    device = resolve_device(cfg.train.device)
    if parallel_jobs == 1 or device.type != "cuda":
        yield lambda: None
        return
    wait_s, start = wait_seconds(), _clock()
    lock = FileLock(Path(sweep_dir) / f".gpu-start-cuda{device.index or 0}.lock")
    try:
        lock.acquire(timeout=wait_s)
    except Timeout:
        raise NotEnoughDeviceMemory(
            f"waited {wait_s:.0f} s for other jobs of this sweep to start on {device}; run the sweep again "
            "(finished jobs are kept), or lower hydra.launcher.n_jobs"
        ) from None
    try:
        _wait_for_memory(device, job_need_bytes(cfg), start, wait_s, parallel_jobs, say)
        yield lock.release
    finally:
        lock.release()


def _wait_for_memory(
    device: torch.device, need: int, start: float, wait_s: float, parallel_jobs: int, say: Callable[[str], None]
) -> None:
    _release_own_cache(device)
    free, total = device_memory(device)
    if need > total:
        raise NotEnoughDeviceMemory(
            f"this job needs about {gib(need)} of device memory and {device} has {gib(total)} in all"
        )
    said = False
    while free < need:
        waited = _clock() - start
        if waited >= wait_s:
            raise NotEnoughDeviceMemory(
                f"this job needs about {gib(need)} of {device}'s memory and {gib(free)} stayed free for {waited:.0f} s "
                f"while other jobs used it; run the sweep again (it resumes), or lower hydra.launcher.n_jobs "
                f"(now {parallel_jobs})"
            )
        if not said:
            say(
                f"waiting for {gib(need)} of free memory on {device} ({gib(free)} free now; other jobs of the sweep "
                f"use it), at most {wait_s:.0f} s (${WAIT_ENV})"
            )
            said = True
        _sleep(min(POLL_S, max(0.0, wait_s - waited)))
        free, _ = device_memory(device)


def released_after_first_step(callback: Callable[[dict[str, Any]], None], release: Callable[[], None]) -> Any:
    """`callback`, releasing the start slot once the first training step (or the end) is reported."""
    done = False

    def wrapped(event: dict[str, Any]) -> None:
        nonlocal done
        if not done and event.get("event") in ("step", "end"):
            done = True
            release()
        callback(event)

    return wrapped


def oom_reason(error: BaseException, parallel_jobs: int) -> str | None:
    """The one-line failure reason of a job that ran out of device memory (None for any other error)."""
    if not isinstance(error, torch.OutOfMemoryError):
        return None
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "out of memory")
    shared = f" with {parallel_jobs} jobs sharing the device" if parallel_jobs != 1 else ""
    advice = "with a lower hydra.launcher.n_jobs" if parallel_jobs != 1 else "with a smaller train.batch_size"
    return (
        f"out of device memory{shared} ({first[:160]}); run the sweep again {advice} (the job resumes from its "
        "last checkpoint)"
    )
