"""Exception types shared across posenc.

`UserError` is what a user can fix (bad override, missing file, wrong checkpoint kind, impossible length): the CLI
prints its message on one line and exits with code 2. `Stopped` is a termination signal raised as an exception
(`sigterm_raises`): the CLI exits 128 + the signal with one line. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any


class UserError(Exception):
    """A problem the user can fix; rendered as one line, exit code 2."""


class ConfigError(UserError):
    """A configuration value or key is invalid."""


class CheckpointError(UserError):
    """A run directory or one of its files is missing, corrupt or of the wrong kind."""


class DataError(UserError):
    """A data source cannot be read or fetched."""


class NotExportable(UserError):
    """A run's model has no exactly matching architecture in `transformers` (`posenc export`)."""


class LengthBeyondScheme(UserError):
    """A positional scheme cannot serve the requested sequence length."""

    def __init__(self, scheme: str, limit: int, requested: int) -> None:
        self.scheme = scheme
        self.limit = limit
        self.requested = requested
        super().__init__(f"{self.reason}; {requested} were requested")

    @property
    def reason(self) -> str:
        """Why a result cell is n/a: the same text for every evaluation."""
        return f"scheme '{self.scheme}' supports at most {self.limit} positions"


# Errors of the storage, not of posenc: no space, read-only, no permission, over quota, and a path the user gave
# with a name longer than the file system takes (ENAMETOOLONG: a 300-byte --out). The CLI reports them as one line
# naming the path (exit 2); any other OSError is unexpected and keeps its traceback.
DISK_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENOSPC", "EROFS", "EACCES", "EDQUOT", "EPERM", "ENAMETOOLONG")
    if hasattr(errno, name)
)


# numpy's `tofile` (and other C writers) report a short write, which on a local file system means it is full, as
# an OSError without errno: "4096 requested and 1024 written".
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def is_disk_error(e: BaseException) -> bool:
    """True for an `OSError` of the disk kind (`DISK_ERRNOS`, or a short write without errno)."""
    if not isinstance(e, OSError):
        return False
    return e.errno in DISK_ERRNOS or (e.errno is None and bool(_SHORT_WRITE.search(str(e))))


def disk_error_message(e: OSError) -> str:
    """'PATH: No space left on device' (both paths of a rename); the storage's own words, one line."""
    short = _SHORT_WRITE.search(str(e)) if e.errno is None else None
    if short is not None:
        what = f"{os.strerror(errno.ENOSPC)} (short write: {short.group(0)})"
    else:
        what = os.strerror(e.errno) if e.errno is not None else str(e)
    paths = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None)
    return f"{paths}: {what}" if paths else f"storage error: {what}"


def is_disk_message(text: str) -> bool:
    """True for a recorded error (a sweep job's failed.json: 'OSError: [Errno 28] No space left on device: ...') that
    names a storage error of `DISK_ERRNOS` or a short write."""
    return any(f"[Errno {n}]" in text for n in DISK_ERRNOS) or bool(_SHORT_WRITE.search(text))


class Stopped(KeyboardInterrupt):
    """A termination signal raised as an exception (a `KeyboardInterrupt`, so whatever cleans up after Ctrl-C
    cleans up after it too); `signum` is the signal, the exit status is 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block SIGTERM raises `Stopped(SIGTERM)` in the main thread (SIGINT already raises
    `KeyboardInterrupt`); the previous handler comes back after. A training loop inside installs
    `run.interrupts.Interrupts`, which takes over until it exits. Outside the main thread (where handlers cannot be
    set) nothing changes. Commands that store their results as they go exit 128+15 with one line instead of being
    killed with no word."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: Any) -> None:
        raise Stopped(signum)

    old = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
