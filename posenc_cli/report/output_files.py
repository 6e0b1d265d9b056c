"""Writing report files (tables, plots) so that a kill at any moment leaves nothing a later write does not clean up.

A write goes through `staged_files(directory)`: every file is first written into a staging directory of this process
inside the target directory, `.posenc-staging.<host>.<pid>/`, then renamed into place (a rename within one
filesystem is atomic: a reader sees the old file or the new one) and the staging directory removed. A SIGKILL
leaves at most that staging directory; the next posenc write into the same directory removes the staging directories
of this host whose process is gone. It touches nothing else: not a file it did not stage, not the staging
directory of a live process, nor one of another host (a shared filesystem, whose process ids are not ours to test).

A directory that cannot be written (a path through a file, no permission, read-only, full) is a `UserError` naming
the path the user gave: one line and exit code 2 in the CLI.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

from posenc_cli.errors import UserError

STAGING_PREFIX = ".posenc-staging"

__all__ = [
    "STAGING_PREFIX",
    "UnwritableError",
    "check_writable_dir",
    "remove_stale_staging",
    "staged_files",
    "staging_name",
]


class UnwritableError(UserError):
    """A report file cannot be written where the user asked."""

    def __init__(self, path: Path, error: OSError) -> None:
        why = os.strerror(error.errno) if error.errno is not None else str(error)
        super().__init__(f"cannot write {path}: {why}")


def check_writable_dir(directory: Path | str, shown: Path | str | None = None) -> None:
    """Fail early (`UnwritableError` naming `shown`, else `directory`, before any work) when `directory` could not
    be created or written: its first existing ancestor is not a directory, or this process may not write there.
    Storage that is full or read-only still fails at the write itself."""
    directory = Path(directory)
    named = Path(shown) if shown is not None else directory
    existing = next((p for p in (directory, *directory.absolute().parents) if p.exists()), None)
    if existing is None:
        return
    if not existing.is_dir():
        raise UnwritableError(named, OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UnwritableError(named, OSError(errno.EACCES, os.strerror(errno.EACCES)))


def staging_name(pid: int | None = None) -> str:
    """`.posenc-staging.<host>.<pid>`: whose staging directory it is, so only a dead owner's is removed."""
    return f"{STAGING_PREFIX}.{socket.gethostname()}.{os.getpid() if pid is None else pid}"


def _owner(name: str) -> tuple[str, int] | None:
    """(host, pid) of a staging directory's name; None for any other name."""
    if not name.startswith(STAGING_PREFIX + "."):
        return None
    host, _, pid = name[len(STAGING_PREFIX) + 1 :].rpartition(".")
    return (host, int(pid)) if host and pid.isdigit() else None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_staging(directory: Path) -> list[Path]:
    """Remove the staging directories in `directory` that a process of this host left when it was killed; returns
    what was removed."""
    host = socket.gethostname()
    removed = []
    for path in Path(directory).glob(STAGING_PREFIX + ".*"):
        owner = _owner(path.name)
        if owner is None or owner[0] != host or _alive(owner[1]) or path.is_symlink() or not path.is_dir():
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


@contextlib.contextmanager
def staged_files(directory: Path | str) -> Iterator[Callable[[str], Path]]:
    """Yield `stage(name)`, the path to write `directory/name` to; when the block ends, every staged file that was
    written is moved into place (fsynced first). On an error nothing is moved and the staging directory is removed.
    OSErrors become `UnwritableError` naming `directory` (or the target file)."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(directory)
        staging = directory / staging_name()
        staging.mkdir(exist_ok=True)
    except OSError as e:
        raise UnwritableError(directory, e) from e
    names: list[str] = []

    def stage(name: str) -> Path:
        if Path(name).name != name:
            raise ValueError(f"{name!r} is not a plain file name")
        names.append(name)
        return staging / name

    try:
        yield stage
        for name in names:
            target = directory / name
            if target.is_dir():
                raise UserError(f"cannot write {target}: it is a directory")
            with open(staging / name, "rb") as f:
                os.fsync(f.fileno())
        for name in names:
            os.replace(staging / name, directory / name)
        _fsync_dir(directory)
    except OSError as e:
        raise UnwritableError(directory, e) from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # platforms without directory fds
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
