"""Run directories: atomic checkpoints, verified loading, and the resume state.

Layout of a run directory::

    model.safetensors   weights (fp32; tied embeddings stored once, as safetensors' `save_model` does)
    state.safetensors   resume state, tensors: optimizer moments/steps, RNG states (torch, cuda, numpy, sampler)
    state.json          resume state, scalars: step, tokens, optimizer param groups, python RNG, schedule
    config.yaml         the resolved config (`config_from_dict` rebuilds it without Hydra)
    tokenizer.json      only for non-byte tokenizers
    meta.json           kind, step, status, versions, data fingerprint, sha256 of every file above, ...
                        (`RunMeta`: the run's identity apart from the record of the command that made it)
    metrics.jsonl       one JSON object per logged step (append-only; cut back to the checkpoint step on resume)

Consistency. A checkpoint is a *set* of files that must match each other (meta.json holds their checksums), and
no filesystem renames several files at once. So a save is a small journal: every file of step k is written and
fsynced into `.pending/`, then `.pending/meta.json` is written last: that write is the commit point. Then the files
are renamed into the run directory one by one, meta.json last, and `.pending/` is removed. Readers see the
*committed view*: while `.pending/meta.json` exists, files still in `.pending/` override those in the run directory,
so a kill at any moment leaves either the complete old checkpoint (before the commit) or the complete new one
(after it). An uncommitted `.pending/` is ignored and deleted by the next save; a committed one is finished by it.

Loading never unpickles: weights and tensors are safetensors, the rest JSON/YAML, and every file's sha256 is checked
against meta.json before it is parsed; keys, shapes, dtypes and finiteness of the weights are checked too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import re
import shutil
import stat
import tempfile
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch
from torch import Tensor, nn

from posenc_cli.config import Config
from posenc_cli.data.tokenizer import Tokenizer, load_tokenizer
from posenc_cli.errors import CheckpointError, UserError
from posenc_cli.fsutil import atomic_write_bytes, atomic_write_json
from posenc_cli.model import build_model
from posenc_cli.run.config_load import config_from_dict
from posenc_cli.run.memory import LOAD_BYTES_PER_PARAM, available_memory, check_fits
from posenc_cli.untrusted import load_json, loads_json, loads_yaml

KIND = "posenc-run"
SCHEMA_VERSION = 1
MODEL_FILE = "model.safetensors"
STATE_FILE = "state.safetensors"
STATE_JSON = "state.json"
CONFIG_FILE = "config.yaml"
META_FILE = "meta.json"
METRICS_FILE = "metrics.jsonl"
PENDING = ".pending"
MAX_SMALL_FILE = 64 * 2**20  # config, JSON and tokenizer files; far above any real one
MAX_SAFETENSORS_HEADER = 100_000_000  # the header limit safetensors itself enforces
_SHA256 = re.compile(r"[0-9a-f]{64}")
STATUSES = ("running", "interrupted", "complete")  # what `train` writes: at start / at a checkpoint, on a signal, done


@dataclass
class LoadedRun:
    path: Path
    model: nn.Module  # posenc_cli.model.GPT
    config: Config
    meta: RunMeta  # the run's identity apart from the record of what made it
    tokenizer: Tokenizer


# Keys of meta.json that identify the checkpoint (what rebuilds the model and names its lineage); every other key is
# the record of the command that made it (training statistics, versions, data fingerprint, an extension's record).
IDENTITY_KEYS = ("kind", "schema_version", "status", "step", "train_length", "base_length", "parent", "files")


@dataclass(frozen=True, kw_only=True)
class RunMeta:
    """meta.json as a type, read and written by this module only (`read_run_meta`, `commit_checkpoint`), built by
    its two constructors only (`for_training`, `scaled_copy`).

    Identity: `kind`, `schema_version`, `status`, `step`, `train_length` (the length this checkpoint trained at; a
    fine-tuned child's L'), `base_length` (the root run's), `parent` (absolute path of the run it was made from) and
    `files` (sha256 per file). `record`: every other key, as read (unknown keys of older or newer files survive a
    round trip). `order`: the key order of the JSON object, kept so a file written back reads the same.
    """

    step: int
    files: dict[str, str] = field(default_factory=dict)
    kind: str = KIND
    schema_version: int = SCHEMA_VERSION
    status: str | None = None
    train_length: int | None = None
    base_length: int | None = None
    parent: str | None = None
    record: dict[str, Any] = field(default_factory=dict)
    order: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, meta: dict[str, Any]) -> RunMeta:
        """A meta.json object (already checked by `read_meta`, or a transformers run's, see `hf_run`)."""
        identity = {k: meta[k] for k in IDENTITY_KEYS if k in meta}
        record = {k: v for k, v in meta.items() if k not in IDENTITY_KEYS}
        return cls(**identity, record=record, order=tuple(meta))

    def to_json(self) -> dict[str, Any]:
        """The JSON object: keys in `order`, then identity keys set but absent from it, then new record keys. An
        identity key left None that the original object did not hold stays absent."""
        values = {k: getattr(self, k) for k in IDENTITY_KEYS} | self.record
        keys = [k for k in self.order if k in values] + [k for k in values if k not in self.order]
        return {k: values[k] for k in keys if k in self.order or k in self.record or values[k] is not None}

    def lengths(self, cfg: Config) -> tuple[int, int]:
        """(train_length, base_length): meta.json's, else (older runs) the config's `train.seq_len`; the base length
        (the root run's training length) defaults to the training length. The one place they are derived."""
        train_length = int(self.train_length or cfg.train.seq_len)
        return train_length, int(self.base_length or train_length)

    @property
    def precision(self) -> str:
        """The precision the checkpoint trained in ('fp32' for runs that predate the record)."""
        return str(self.record.get("precision") or "fp32")

    @property
    def extra(self) -> dict[str, Any]:
        """The keys the command that made this checkpoint added to its own record (named by the record's
        `extra_keys`: an extension's `parent`, `base_length` and `extend`), with their values. A later save of the
        same run (a resumed fine-tune) writes them again."""
        values = self.to_json()
        return {k: values[k] for k in self.record.get("extra_keys", []) if k in values}

    # -- The two ways a checkpoint's meta.json comes to be; the only code that knows its key order. ---------------

    @classmethod
    def for_training(
        cls, *, status: str, step: int, train_length: int, record: TrainingRecord, extra: dict[str, Any]
    ) -> RunMeta:
        """meta.json of a checkpoint `train` saves: a root run (its own base length, no parent) unless `extra` says
        otherwise (`extra` keys override, new ones follow the training record; `extra_keys` lists them all)."""
        own = {f.name: getattr(record, f.name) for f in fields(record)}
        identity = {"status": status, "step": step, "train_length": train_length, "base_length": train_length}
        values = {"kind": KIND, "schema_version": SCHEMA_VERSION, "parent": None} | identity | own
        meta = {k: values[k] for k in _TRAINING_ORDER}
        meta.update(extra)
        meta["extra_keys"] = sorted(extra)
        return cls.from_json(meta)

    @classmethod
    def scaled_copy(cls, parent: RunMeta, *, train_length: int, extra: dict[str, Any], now: str) -> RunMeta:
        """meta.json of a new run holding the parent's weights unchanged under a new config (`extend` without a
        fine-tune): the parent's meta with this command's `extra` keys, no validation loss (the new config was not
        measured) and new timestamps."""
        meta = {k: v for k, v in parent.to_json().items() if k not in ("files", "extra_keys")}
        meta.update(
            status="complete",
            train_length=train_length,
            val_loss=None,  # not measured with the new config; eval-extrapolate measures it
            best_val_loss=None,
            created=now,
            updated=now,
            **extra,
        )
        meta["extra_keys"] = sorted(extra)
        return cls.from_json(meta)


@dataclass(frozen=True, kw_only=True)
class TrainingRecord:
    """What `train` records in meta.json beside the identity: the run's progress, statistics and provenance."""

    steps: int
    tokens: int
    train_loss: float | None
    val_loss: float | None
    best_val_loss: float | None
    seed: int
    pos: str
    model: str
    n_params: int
    precision: str
    device: str
    threads: int
    tokens_per_s: float | None
    wall_time_s: float
    created: str
    updated: str
    versions: dict[str, str]
    data: dict[str, Any]
    tokenizer: dict[str, Any]


# meta.json's key order as `train` writes it (`files` follows: `commit_checkpoint` adds it).
_TRAINING_ORDER = (
    *("kind", "schema_version", "status", "step", "steps", "tokens", "train_loss", "val_loss", "best_val_loss"),
    *("seed", "pos", "model", "n_params", "train_length", "base_length", "parent", "precision", "device"),
    *("threads", "tokens_per_s", "wall_time_s", "created", "updated", "versions", "data", "tokenizer"),
)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------------------------------------------
# Writing: the journal described in the module docstring.


def commit_checkpoint(run_dir: Path, files: dict[str, bytes], meta: RunMeta | dict[str, Any]) -> dict[str, Any]:
    """Atomically replace the run's checkpoint by `files` + `meta` (meta gains `files`: sha256 per file); the one
    writer of meta.json. Returns the meta.json object written."""
    if isinstance(meta, RunMeta):
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


def model_file_bytes(model: nn.Module) -> bytes:
    """safetensors bytes of `model`'s fp32 state dict, tied tensors stored once (as `save_model` does)."""
    state = model.state_dict()
    tensors: dict[str, Tensor] = {}
    removed: dict[str, str] = {}
    for group in tied_groups(state):
        keep = sorted(group)[0]
        tensors[keep] = state[keep].detach().to("cpu").contiguous()
        removed.update({name: keep for name in group if name != keep})
    return canonical_safetensors(safetensors.torch.save(tensors, metadata={"format": "pt", **removed}))


def canonical_safetensors(data: bytes) -> bytes:
    """The same safetensors bytes with the header's `__metadata__` keys in sorted order.

    safetensors keeps the metadata in a Rust HashMap, whose iteration order is random per map, so two saves of the
    same tensors can differ in their header. Sorting the keys makes a resumed run's file byte-identical to an
    uninterrupted run's. Only the order changes, so the header keeps its length and the tensor offsets stay valid.
    """
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or len(meta) < 2:
        return data
    ordered = {"__metadata__": dict(sorted(meta.items())), **{k: v for k, v in header.items() if k != "__metadata__"}}
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > n:  # a serialisation we do not reproduce exactly: keep the original bytes
        return data
    return data[:8] + text.ljust(n, b" ") + data[8 + n :]


def tied_groups(state: dict[str, Tensor]) -> list[list[str]]:
    """Names of state-dict entries grouped by the storage they share (tied weights share one group)."""
    groups: dict[Any, list[str]] = defaultdict(list)
    for name, t in state.items():
        if t.numel() == 0:
            groups[("empty", name)].append(name)
            continue
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        groups[key].append(name)
    return list(groups.values())


def tokenizer_files(tokenizer: Tokenizer) -> dict[str, bytes]:
    """The files `tokenizer.save(dir)` writes (none for the byte tokenizer), as bytes for `commit_checkpoint`."""
    with tempfile.TemporaryDirectory(prefix="posenc-tok-") as tmp:
        tokenizer.save(Path(tmp))
        return {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}


# ----------------------------------------------------------------------------------------------------------------
# Reading the committed view.


def committed_file(run_dir: Path, name: str) -> Path:
    """Where file `name` of the committed checkpoint lives (`.pending/` while a commit is being applied)."""
    pending = Path(run_dir) / PENDING
    if (pending / META_FILE).is_file() and (pending / name).is_file():
        return pending / name
    return Path(run_dir) / name


class NotARunError(CheckpointError):
    """`read_meta` on a directory that is not a posenc run at all (no meta.json, or one of another kind), as opposed
    to a posenc run whose meta.json is corrupt, unsupported or incomplete."""


def is_run_dir(path: Path | str) -> bool:
    """True when `path` holds a committed posenc run (meta.json of kind posenc-run); checksums are not checked."""
    try:
        read_meta(Path(path))
    except (UserError, OSError):
        return False
    return True


def read_meta(run_dir: Path) -> dict[str, Any]:
    """meta.json of the committed checkpoint; `NotARunError` when `run_dir` is not a posenc run, `CheckpointError`
    when its meta.json is unreadable, corrupt (not a JSON object), unsupported or incomplete."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise NotARunError(f"run directory {run_dir} does not exist")
    path = committed_file(run_dir, META_FILE)
    if not run_dir.is_dir() or not path.is_file() or run_dir.name == PENDING:
        raise NotARunError(f"{run_dir} is not a posenc run directory (no {META_FILE})")
    try:
        meta = load_json(path, what="run metadata", max_bytes=MAX_SMALL_FILE, error=CheckpointError)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: unreadable or corrupt ({str(e).removeprefix(f'{path}: ')})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: unreadable or corrupt (not a JSON object)")
    if meta.get("kind") != KIND:
        raise NotARunError(f"{run_dir} is not a posenc run directory ({META_FILE} is not of kind {KIND})")
    version = meta.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise CheckpointError(
            f"{path}: schema_version {version!r} is not supported by this posenc (max {SCHEMA_VERSION})"
        )
    if not isinstance(meta.get("files"), dict) or not isinstance(meta.get("step"), int):
        raise CheckpointError(f"{path}: incomplete (no step or file checksums)")
    check_meta_fields(meta, path)
    for name, digest in meta["files"].items():
        if not is_plain_name(name):
            raise CheckpointError(f"{path}: lists {name!r}, which is not a plain file name inside the run directory")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise CheckpointError(f"{path}: the checksum of {name} is not a sha256 digest")
    return meta


def check_meta_fields(meta: dict[str, Any], path: Path) -> None:
    """`CheckpointError` naming `path` and the field when a field that decides what a run is, or how its results are
    labelled, has the wrong type or range (a hand-edited `train_length: "abc"` or `base_length: -128` would
    otherwise reach a results column). Absent fields stay allowed (older runs)."""

    def bad(key: str, expected: str) -> CheckpointError:
        return CheckpointError(f"{path}: field '{key}' is {meta[key]!r}, expected {expected}")

    for key, low in (("step", 0), ("steps", 0), ("tokens", 0), ("train_length", 1), ("base_length", 1)):
        value = meta.get(key)
        if key in ("train_length", "base_length") and value is None:
            continue
        if key in meta and not (_whole(value) and value >= low):
            raise bad(key, f"a whole number >= {low}")
    if meta.get("status") is not None and meta["status"] not in STATUSES:
        raise bad("status", " or ".join(repr(s) for s in STATUSES))
    for key in ("parent", "precision", "device", "pos"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise bad(key, "a string")
    for key in ("train_loss", "val_loss", "best_val_loss", "tokens_per_s", "wall_time_s"):
        value = meta.get(key)
        if value is not None and not (isinstance(value, int | float) and not isinstance(value, bool)):
            raise bad(key, "a number or null")
    keys = meta.get("extra_keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise bad("extra_keys", "a list of names")


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def incomplete_reason(meta: RunMeta | dict[str, Any]) -> str | None:
    """None when the run's meta.json says its training finished; else why not, e.g. "training stopped at step 0 of
    60" (`status` "running" or "interrupted": a run killed mid-way, or an `extend --finetune-steps` child killed
    before its fine-tune ended, whose weights are still the parent's). A meta.json without a status (older runs)
    counts as finished when its step reached its steps."""
    values = meta.to_json() if isinstance(meta, RunMeta) else meta
    status, step, steps = values.get("status"), values.get("step"), values.get("steps")
    finished = status == "complete" if status is not None else True
    if finished and not (_whole(step) and _whole(steps) and step < steps):
        return None
    where = f"step {step} of {steps}" if _whole(steps) else f"step {step}"
    return f"training stopped at {where}" if status != "complete" else f"marked complete at {where}"


def require_complete(meta: RunMeta | dict[str, Any], run_dir: Path | str) -> None:
    """`CheckpointError` (one line) unless the run at `run_dir` finished training: a result measured on it would
    be labelled as the finished run's. Resuming (`posenc train --resume`) loads such a run without this check."""
    reason = incomplete_reason(meta)
    if reason is not None:
        raise CheckpointError(
            f"{run_dir} is incomplete ({reason}); resume it with `posenc train --resume {run_dir}` or remove it"
        )


def read_run_meta(run_dir: Path) -> RunMeta:
    """`read_meta` as a `RunMeta`."""
    return RunMeta.from_json(read_meta(run_dir))


def is_plain_name(name: object) -> bool:
    """A file name with no directory part (no '/', '..', absolute path or hidden name): it stays in the run dir."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= 255
        and not name.startswith(".")
        and not any(c in name for c in "/\\\0")
    )


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


def read_config(run_dir: Path, meta: dict[str, Any]) -> Config:
    path = committed_file(run_dir, CONFIG_FILE)
    data = read_verified(run_dir, meta["files"], CONFIG_FILE)
    try:
        return config_from_dict(loads_yaml(data, source=path, what="config", error=CheckpointError), saved=True)
    except UserError as e:
        raise CheckpointError(f"{path}: invalid config ({str(e).splitlines()[0].removeprefix(f'{path}: ')})") from e


def load_tensors(run_dir: Path, meta: dict[str, Any], name: str) -> dict[str, Tensor]:
    """Verified safetensors file -> CPU tensors (no code path: safetensors is a JSON header plus raw bytes)."""
    data = read_verified(run_dir, meta["files"], name)
    try:
        return safetensors.torch.load(data)
    except Exception as e:  # SafetensorError, ValueError, ... from a corrupt or hostile file
        raise CheckpointError(f"{committed_file(run_dir, name)}: not a valid safetensors file ({e})") from e


def load_weights_into(model: nn.Module, tensors: dict[str, Tensor], path: Path) -> None:
    """Check names, shapes, dtypes and finiteness of `tensors` against `model`, then load them."""
    expected = model.state_dict()
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise CheckpointError(f"{path}: unexpected tensor '{unexpected[0]}' (checkpoint of a different model?)")
    full: dict[str, Tensor] = {}
    for group in tied_groups(expected):
        present = [n for n in group if n in tensors]
        if not present:
            raise CheckpointError(f"{path}: missing tensor '{group[0]}'")
        src = tensors[present[0]]
        ref = expected[group[0]]
        if tuple(src.shape) != tuple(ref.shape) or src.dtype != ref.dtype:
            got, want = f"{src.dtype} {tuple(src.shape)}", f"{ref.dtype} {tuple(ref.shape)}"
            raise CheckpointError(f"{path}: tensor '{present[0]}' is {got}, expected {want}")
        if src.is_floating_point() and not bool(torch.isfinite(src).all()):
            raise CheckpointError(f"{path}: tensor '{present[0]}' has non-finite values")
        full.update({n: src for n in group})
    model.load_state_dict(full, strict=True)


def load_run(path: Path | str, device: str | torch.device = "cpu", *, complete_only: bool = True) -> LoadedRun:
    """Model, config, metadata and tokenizer of a run directory, with every file verified.

    Raises `CheckpointError` naming the file when anything is missing, truncated, corrupt or tampered with, and
    (unless `complete_only=False`) when the run did not finish training (`require_complete`): evaluating,
    extending or exporting it would label the numbers of unfinished weights (an interrupted fine-tune's are still
    its parent's) as the run's. A trainer committing a new checkpoint while we read can make one attempt
    inconsistent; we then read again.
    """
    run_dir = Path(path)
    for _attempt in range(3):
        meta = read_meta(run_dir)
        if complete_only:
            require_complete(meta, run_dir)
        try:
            return _load_run_once(run_dir, meta, device)
        except CheckpointError:
            with contextlib.suppress(UserError, OSError):
                if read_meta(run_dir) != meta:
                    continue  # a new checkpoint was committed meanwhile
            raise
    raise CheckpointError(f"{run_dir}: checkpoint kept changing while being read")


def _load_run_once(run_dir: Path, meta: dict[str, Any], device: str | torch.device) -> LoadedRun:
    for name in sorted(meta["files"]):  # every file, resume state included, must match its checksum
        if name not in (MODEL_FILE, CONFIG_FILE):
            read_verified(run_dir, meta["files"], name)
    cfg = read_config(run_dir, meta)
    tok_dir = committed_file(run_dir, "tokenizer.json").parent
    try:
        tokenizer = load_tokenizer(cfg.tokenizer, tok_dir)
    except UserError as e:
        raise CheckpointError(f"{run_dir}: tokenizer could not be loaded ({e})") from e
    expected_fp = (meta.get("tokenizer") or {}).get("fingerprint")
    if expected_fp is not None and tokenizer.fingerprint != expected_fp:
        raise CheckpointError(f"{tok_dir / 'tokenizer.json'}: tokenizer fingerprint differs from {META_FILE}")
    check_fits(cfg, tokenizer.vocab_size, LOAD_BYTES_PER_PARAM, f"loading {run_dir}")  # before any allocation
    tensors = load_tensors(run_dir, meta, MODEL_FILE)
    model = build_model(cfg, tokenizer.vocab_size)
    load_weights_into(model, tensors, committed_file(run_dir, MODEL_FILE))
    model.to(device)
    model.eval()
    return LoadedRun(path=run_dir, model=model, config=cfg, meta=RunMeta.from_json(meta), tokenizer=tokenizer)


# ----------------------------------------------------------------------------------------------------------------
# Resume state: optimizer + RNG as safetensors tensors plus JSON scalars (never a pickle).


def pack_optimizer(optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict[str, Any]]:
    state = optimizer.state_dict()
    tensors: dict[str, Tensor] = {}
    extra: dict[str, dict[str, Any]] = {}
    for pid, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, Tensor):
                tensors[f"optim.{pid}.{key}"] = value.detach().to("cpu").contiguous()
            else:
                extra.setdefault(str(pid), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "extra": extra}


def unpack_optimizer(
    optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor], info: dict[str, Any], path: Path
) -> None:
    current = optimizer.state_dict()["param_groups"]
    groups = info.get("param_groups")
    if not isinstance(groups, list) or [g.get("params") for g in groups] != [g["params"] for g in current]:
        raise CheckpointError(f"{path}: optimizer state does not match this model's parameters")
    state: dict[int, dict[str, Any]] = defaultdict(dict)
    for name, t in tensors.items():
        if name.startswith("optim."):
            _, pid, key = name.split(".", 2)
            state[int(pid)][key] = t
    for pid, entries in (info.get("extra") or {}).items():
        state[int(pid)].update(entries)
    for g in groups:
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
    check_optimizer_state(optimizer, state, groups, path)
    try:
        optimizer.load_state_dict({"state": dict(state), "param_groups": groups})
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(f"{path}: optimizer state could not be restored ({e})") from e


def check_optimizer_state(
    optimizer: torch.optim.Optimizer, state: dict[int, dict[str, Any]], groups: list[Any], path: Path
) -> None:
    """Before AdamW sees it: every moment has its parameter's shape and dtype and is finite (exp_avg_sq >= 0),
    every step is a finite whole number >= 0, and the groups' hyperparameters are numbers in range. A wrong-shaped
    moment would otherwise crash the fused kernel or be broadcast silently."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for g in groups:
        betas = g.get("betas")
        numbers = [g.get("lr"), g.get("eps"), g.get("weight_decay"), *(betas if isinstance(betas, tuple) else [None])]
        if not all(_finite_number(v) and v >= 0 for v in numbers) or not all(0 <= b < 1 for b in betas):
            raise CheckpointError(f"{path}: optimizer hyperparameters are invalid")
    for pid, entries in state.items():
        if not 0 <= pid < len(params):
            raise CheckpointError(f"{path}: optimizer state for parameter {pid}, which this model does not have")
        p = params[pid]
        for key, value in entries.items():
            if key == "step":
                v = float(value) if isinstance(value, Tensor) and value.numel() == 1 else value
                if not _finite_number(v) or v < 0 or v != int(v):
                    raise CheckpointError(f"{path}: optimizer step of parameter {pid} is invalid")
            elif key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                if not isinstance(value, Tensor) or value.shape != p.shape or value.dtype != p.dtype:
                    got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__
                    raise CheckpointError(
                        f"{path}: optimizer {key} of parameter {pid} is {got}, expected {p.dtype} {tuple(p.shape)}"
                    )
                if not bool(torch.isfinite(value).all()) or (key != "exp_avg" and bool((value < 0).any())):
                    raise CheckpointError(f"{path}: optimizer {key} of parameter {pid} has invalid values")
            else:
                raise CheckpointError(f"{path}: unexpected optimizer state '{key}' for parameter {pid}")


def _finite_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def capture_rng(sampler: torch.Generator) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """RNG states of python, numpy, torch (CPU and CUDA) and the batch sampler."""
    tensors = {"rng.torch": torch.get_rng_state(), "rng.sampler": sampler.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)
    tensors["rng.numpy"] = torch.from_numpy(np_state[1].astype(np.int64))
    py_version, py_state, py_gauss = random.getstate()
    info = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": {"name": np_state[0], "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "gauss": np_state[4]},
    }
    return tensors, info


def restore_rng(
    tensors: dict[str, Tensor], info: dict[str, Any], sampler: torch.Generator, *, sampler_too: bool = True
) -> None:
    try:
        version, state, gauss = info["python"]
        random.setstate((version, tuple(state), gauss))
        n = info["numpy"]
        keys = tensors["rng.numpy"].numpy().astype(np.uint32)
        np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["gauss"]))
        torch.set_rng_state(tensors["rng.torch"])
        torch.Generator().set_state(tensors["rng.sampler"])  # checked before anything is changed below
    except (TypeError, ValueError, KeyError, IndexError, RuntimeError) as e:
        raise CheckpointError(f"resume state: the saved random-number state is invalid ({type(e).__name__})") from e
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    if sampler_too:
        sampler.set_state(tensors["rng.sampler"])


def state_file_bytes(tensors: dict[str, Tensor]) -> bytes:
    return safetensors.torch.save(tensors, metadata={"format": "pt"})


def read_state(run_dir: Path, meta: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The verified resume state: (tensors, scalars)."""
    tensors = load_tensors(run_dir, meta, STATE_FILE)
    path = committed_file(run_dir, STATE_JSON)
    info = loads_json(
        read_verified(run_dir, meta["files"], STATE_JSON), source=path, what="resume state", error=CheckpointError
    )
    required = ("step", "tokens", "optimizer", "rng")
    if not isinstance(info, dict) or any(k not in info for k in required):
        raise CheckpointError(f"{path}: incomplete resume state")
    counts = (info["step"], info["tokens"])
    if (
        not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts)
        or info["step"] != meta["step"]
    ):
        raise CheckpointError(f"{path}: step or tokens are not whole numbers >= 0 matching {META_FILE}")
    for key in ("elapsed_s", "best_val_loss", "train_loss", "val_loss"):
        if info.get(key) is not None and not (isinstance(info[key], int | float) and not isinstance(info[key], bool)):
            raise CheckpointError(f"{path}: {key} is not a number")
    if not isinstance(info["optimizer"], dict) or not isinstance(info["optimizer"].get("extra", {}), dict):
        raise CheckpointError(f"{path}: optimizer state is not a mapping")
    groups = info["optimizer"].get("param_groups")
    if not isinstance(groups, list) or not all(
        isinstance(g, dict) and isinstance(g.get("params"), list) and all(_whole(i) for i in g["params"])
        for g in groups
    ):
        raise CheckpointError(f"{path}: field 'optimizer.param_groups' is not a list of groups with parameter ids")
    extra = info["optimizer"].get("extra", {})
    if not all(isinstance(k, str) and k.isdigit() and isinstance(v, dict) for k, v in extra.items()):
        raise CheckpointError(f"{path}: field 'optimizer.extra' is not a mapping of parameter ids to mappings")
    if not isinstance(info["rng"], dict):
        raise CheckpointError(f"{path}: field 'rng' is not a mapping")
    missing = [k for k in ("rng.torch", "rng.sampler", "rng.numpy") if k not in tensors]
    if missing:
        raise CheckpointError(f"{committed_file(run_dir, STATE_FILE)}: missing tensor '{missing[0]}'")
    return tensors, info
