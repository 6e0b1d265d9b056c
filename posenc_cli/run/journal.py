"""Atomic checkpoints: a run's files committed as one, recovery after a kill, and the committed view readers see.

A checkpoint is a *set* of files that must match each other (meta.json holds their checksums), and no filesystem
renames several files at once. So a save is a small journal: every file of step k is written and fsynced into
`.pending/`, then `.pending/meta.json` is written last: that write is the commit point. Then the files are renamed
into the run directory one by one, meta.json last, and `.pending/` is removed. Readers see the *committed view*
(`committed_file`): while `.pending/meta.json` exists, files still in `.pending/` override those in the run
directory, so a kill at any moment leaves either the complete old checkpoint (before the commit) or the complete new
one (after it). An uncommitted `.pending/` is ignored and deleted by the next save; a committed one is finished by it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any, Protocol

from posenc_cli.fsutil import atomic_write_bytes, atomic_write_json
from posenc_cli.run.layout import META_FILE, PENDING


class JsonRecord(Protocol):
    """A record that gives the JSON object it is saved as (`run.meta.RunMeta`, which sits above this module)."""

    def to_json(self) -> dict[str, Any]: ...


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def commit_checkpoint(run_dir: Path, files: dict[str, bytes], meta: JsonRecord | dict[str, Any]) -> dict[str, Any]:
    """Atomically replace the run's checkpoint by `files` + `meta` (meta gains `files`: sha256 per file); the one
    writer of meta.json. Returns the meta.json object written."""
    if not isinstance(meta, dict):  # a RunMeta
        meta = meta.to_json()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    recover(run_dir)
    pending = run_dir / PENDING
    pending.mkdir()
    for name, data in files.items():
        atomic_write_bytes(pending / name, data)
    meta = {**meta, "files": {name: sha256_bytes(data) for name, data in sorted(files.items())}}
    atomic_write_json(pending / META_FILE, meta)  # the commit point
    _apply_pending(run_dir)
    return meta


def recover(run_dir: Path) -> None:
    """Finish a committed `.pending/` (kill during the renames) or drop an uncommitted one (kill while writing)."""
    pending = Path(run_dir) / PENDING
    if (pending / META_FILE).is_file():
        _apply_pending(Path(run_dir))
    elif pending.exists():
        shutil.rmtree(pending, ignore_errors=True)


def _apply_pending(run_dir: Path) -> None:
    pending = run_dir / PENDING
    for path in sorted(pending.iterdir()):
        if path.name != META_FILE and not path.name.startswith("."):
            os.replace(path, run_dir / path.name)
    fsync_dir(run_dir)
    os.replace(pending / META_FILE, run_dir / META_FILE)
    fsync_dir(run_dir)
    shutil.rmtree(pending, ignore_errors=True)


def fsync_dir(directory: Path) -> None:
    """Make renames in `directory` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def committed_file(run_dir: Path, name: str) -> Path:
    """Where file `name` of the committed checkpoint lives (`.pending/` while a commit is being applied)."""
    pending = Path(run_dir) / PENDING
    if (pending / META_FILE).is_file() and (pending / name).is_file():
        return pending / name
    return Path(run_dir) / name
