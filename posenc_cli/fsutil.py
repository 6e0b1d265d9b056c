"""Atomic file writes: a kill at any moment leaves either the old file or the new one, never half of one.

A write that fails for lack of space names the file it was writing: `os.write` and friends raise `OSError` without
a file name, and a short write (numpy's `tofile`: "N requested and M written") carries no errno at all; inside
`atomic_path` both become `OSError(errno, strerror, path)` with the target's path (`named_storage_error`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path in the same directory as `path`; on success fsync it and rename it over `path`.

    The temporary file lives next to the target so the final `os.replace` is a rename on one filesystem, which
    is atomic. On error the temporary file is removed and `path` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the mode a plain open() would
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        named = named_storage_error(e, path, tmp)
        if named is e:
            raise
        raise named from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def named_storage_error(e: OSError, path: Path, tmp: Path | None = None) -> OSError:
    """`e` naming `path`: the same errno and message with `path` as its file name when `e` names no file (or only
    the temporary file `tmp`); a short write without errno ("N requested and M written": the storage took fewer
    bytes than given, which on a local file system means it is full) becomes ENOSPC. Any other error is `e`."""
    if e.errno is None and _SHORT_WRITE.search(str(e)):
        return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (short write: {e})", str(path))
    if e.errno is not None and (e.filename is None or (tmp is not None and e.filename == str(tmp))):
        return OSError(e.errno, e.strerror or os.strerror(e.errno), str(path))
    return e


def write_all(f: Any, data: Any) -> None:
    """Write every byte of `data` (bytes or a contiguous array) to the binary file `f`; a storage that takes fewer
    bytes raises an `OSError` (ENOSPC, naming `f`'s file) instead of being ignored or raising without errno."""
    view = memoryview(data).cast("B")
    written = f.write(view)
    if written is not None and written < len(view):
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (short write)", getattr(f, "name", None))


def atomic_write(path: Path, write: Callable[[Path], Any]) -> None:
    """Call `write(tmp_path)` and atomically move the result to `path`."""
    with atomic_path(path) as tmp:
        write(tmp)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def make_temp_dir(parent: Path, prefix: str) -> Path:
    """A new, uniquely named directory in `parent` (created if needed) with the mode a plain `mkdir` gives
    (0o777 less the umask), for a result that is renamed into place when complete: `tempfile.mkdtemp`'s 0o700
    would make the published directory unreadable to everyone else."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    set_default_mode(tmp)
    return tmp


def set_default_mode(path: Path) -> None:
    """Give `path` the mode a plain `open()`/`mkdir` would (0o666 or 0o777 less the umask), for files that a
    library creates private (safetensors' `save_file` writes 0o600)."""
    os.chmod(path, (0o777 if Path(path).is_dir() else 0o666) & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive_or_fail(lock_path: Path, busy: Callable[[], Exception]) -> Iterator[None]:
    """Hold the file lock at `lock_path` (its directory is created if needed) for the block, or raise `busy()` at once
    when another process holds it (no waiting)."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(lock_path, timeout=0)
    try:
        lock.acquire()
    except Timeout as e:
        raise busy() from e
    try:
        yield
    finally:
        lock.release()
