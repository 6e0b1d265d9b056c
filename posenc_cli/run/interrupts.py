"""Graceful stops: SIGINT/SIGTERM finish the training step (or micro-step) under way, save, and return; outside the
training loop SIGTERM ends a command as Ctrl-C does, through its error handling.

`Interrupts` turns the first signal into a flag the loop checks after each micro-step (a second one interrupts at
once); in a data-parallel job, `agree` makes every rank stop after the same step. Outside the loop SIGTERM raises
`errors.Stopped` (`errors.sigterm_raises`, which the CLI installs for every command). `run_lock` keeps a second
trainer out of a run directory that is being trained; `run_is_locked` lets an evaluation refuse such a run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc_cli.errors import CheckpointError

if TYPE_CHECKING:
    import torch

    from posenc_cli.run.distributed import DistInfo

LOCK_FILE = ".lock"  # `run_lock`'s file in a run directory


class Interrupts:
    """SIGINT/SIGTERM set a flag the loop checks after each step; a second signal interrupts at once.

    In a data-parallel job (`defer=True`) a signal is only noted, and `agree` makes every rank stop after the same
    step (the largest signal number any rank received), so no rank leaves a collective the others still wait in.
    """

    def __init__(self, defer: bool = False) -> None:
        self.signum: int | None = None
        self.pending: int | None = None
        self.defer = defer
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._old.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None or self.pending is not None:
            self.__exit__()
            raise KeyboardInterrupt
        if self.defer:
            self.pending = signum
        else:
            self.signum = signum

    def agree(self, info: DistInfo, device: torch.device) -> None:
        """All ranks: adopt the largest signal any rank has received so far (one tiny all-reduce)."""
        import torch  # deferred: the sweep's job log imports `Interrupts` before any job needs torch

        from posenc_cli.run import distributed

        flag = torch.tensor([self.signum or self.pending or 0], dtype=torch.int64, device=device)
        got = int(distributed.all_reduce_(flag, info, op="max").item())
        if got:
            self.signum = got


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """One trainer per run directory (advisory lock; skipped where fcntl does not exist)."""
    try:
        import fcntl  # deferred: POSIX only (no fcntl on Windows)
    except ImportError:
        yield
        return
    with open(run_dir / LOCK_FILE, "a") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            raise CheckpointError(f"{run_dir} is being trained by another process") from e
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def run_is_locked(run_dir: Path) -> bool:
    """True while another process trains `run_dir` (holds `run_lock`); creates nothing, False without fcntl."""
    try:
        import fcntl  # deferred: POSIX only (no fcntl on Windows)
    except ImportError:
        return False
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY)
    except OSError:  # no lock file: never trained here, or nothing we may open
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


__all__ = ["LOCK_FILE", "Interrupts", "run_is_locked", "run_lock"]
