"""Reading a run's files: bounded before they are read, verified against meta.json's checksums before they are parsed.

Loading never unpickles: weights and tensors are safetensors, the rest JSON/YAML. A file is read only when it is a
regular file inside the run directory no larger than it can be, and its bytes reach a parser only when their sha256
matches the one meta.json lists.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
from torch import Tensor

from posenc_cli.errors import CheckpointError
from posenc_cli.run.journal import committed_file, sha256_bytes
from posenc_cli.run.layout import MAX_SAFETENSORS_HEADER, MAX_SMALL_FILE, META_FILE
from posenc_cli.run.memory import available_memory


def read_verified(run_dir: Path, files: Mapping[str, str], name: str) -> bytes:
    """Bytes of committed file `name`, after checking its sha256 against `files` (meta.json's)."""
    path = committed_file(run_dir, name)
    expected = files.get(name)
    if expected is None:
        raise CheckpointError(f"{path}: not listed in {META_FILE}")
    try:
        data = read_bounded(Path(run_dir), path)
    except FileNotFoundError as e:
        raise CheckpointError(f"{path}: missing") from e
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable ({e.strerror})") from e
    if sha256_bytes(data) != expected:
        raise CheckpointError(f"{path}: checksum mismatch (truncated, corrupt or modified since it was saved)")
    return data


def read_bounded(run_dir: Path, path: Path) -> bytes:
    """Bytes of `path` after checking, before reading, that it is a regular file inside `run_dir` (a symlink may
    point only inside it: never at a device, a FIFO or another directory) and no larger than it can be: a safetensors
    file the size its header describes (header at most `MAX_SAFETENSORS_HEADER`, data within available memory), any
    other file at most `MAX_SMALL_FILE`."""
    if path.is_symlink() and not path.resolve().is_relative_to(run_dir.resolve()):
        raise CheckpointError(f"{path}: a symlink that points outside the run directory")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))  # a FIFO: no hang
    try:
        size = os.fstat(fd).st_size
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"{path}: not a regular file")
        limit = _safetensors_size(fd, size, path) if path.suffix == ".safetensors" else MAX_SMALL_FILE
        if size > limit:
            raise CheckpointError(f"{path}: {size} bytes, more than the {limit} it can be (damaged or foreign)")
        return _read_at(fd, 0, size)  # smaller than it should be: the checksum or the parser says so
    finally:
        os.close(fd)


def _safetensors_size(fd: int, size: int, path: Path) -> int:
    """The size a safetensors file may have: what its header describes (8 + header + end of the last tensor), or
    `MAX_SMALL_FILE` when the header is unreadable (the checksum or the parser then reports the damage); a
    `CheckpointError` when the header describes more tensor data than memory holds."""
    n = int.from_bytes(_read_at(fd, 0, 8), "little") if size >= 8 else -1
    if not 0 <= n <= MAX_SAFETENSORS_HEADER or 8 + n > size:
        return MAX_SMALL_FILE
    try:
        header = json.loads(_read_at(fd, 8, n))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        return MAX_SMALL_FILE
    data = max(ends, default=0)
    available = available_memory()
    if data < 0 or (available is not None and data > available):
        raise CheckpointError(f"{path}: its header describes {data} bytes of tensors, more than memory holds")
    return 8 + n + data


def _read_at(fd: int, offset: int, n: int) -> bytes:
    os.lseek(fd, offset, os.SEEK_SET)
    chunks, left = [], n
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 26))
        if not chunk:
            break  # shorter than it was a moment ago: the checksum or the parser reports it
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def load_tensors(run_dir: Path, meta: dict[str, Any], name: str) -> dict[str, Tensor]:
    """Verified safetensors file -> CPU tensors (no code path: safetensors is a JSON header plus raw bytes)."""
    data = read_verified(run_dir, meta["files"], name)
    try:
        return safetensors.torch.load(data)
    except Exception as e:  # SafetensorError, ValueError, ... from a corrupt or hostile file
        raise CheckpointError(f"{committed_file(run_dir, name)}: not a valid safetensors file ({e})") from e
