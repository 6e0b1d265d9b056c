"""meta.json: the run metadata schema (`RunMeta`, `TrainingRecord`), reading and validating it, whether a run
finished training, and what a directory is (a posenc run: `is_run_dir`; a transformers model's: `is_hf_dir`).

`RunMeta` is the one type of meta.json; `read_meta` is its one checked reader (the dict, for code that compares or
rewrites it), `read_run_meta` the typed one; `run.journal.commit_checkpoint` its one writer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from posenc_cli.config import Config
from posenc_cli.errors import CheckpointError, UserError
from posenc_cli.run.journal import committed_file
from posenc_cli.run.layout import KIND, MAX_SMALL_FILE, META_FILE, PENDING, SCHEMA_VERSION, STATUSES
from posenc_cli.untrusted import load_json

_SHA256 = re.compile(r"[0-9a-f]{64}")
HF_CONFIG_FILE = "config.json"  # what makes a directory a transformers model's (`is_hf_dir`, `run.hf_run`)


# Keys of meta.json that identify the checkpoint (what rebuilds the model and names its lineage); every other key is
# the record of the command that made it (training statistics, versions, data fingerprint, an extension's record).
IDENTITY_KEYS = ("kind", "schema_version", "status", "step", "train_length", "base_length", "parent", "files")


@dataclass(frozen=True, kw_only=True)
class RunMeta:
    """meta.json as a type, read by `read_run_meta` and written by `run.journal.commit_checkpoint` only, built by
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


def is_hf_dir(path: Path | str) -> bool:
    """True when `path` is a directory with a `config.json` and no meta.json (a transformers model directory, maybe
    not loadable: `run.hf_run` reads it)."""
    p = Path(path)
    return p.is_dir() and (p / HF_CONFIG_FILE).is_file() and not (p / META_FILE).is_file()


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
        if key in meta and not (is_whole_number(value) and value >= low):
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


def is_whole_number(v: Any) -> bool:
    """An int that is not a bool (JSON `true` is not a count)."""
    return isinstance(v, int) and not isinstance(v, bool)


def incomplete_reason(meta: RunMeta | dict[str, Any]) -> str | None:
    """None when the run's meta.json says its training finished; else why not, e.g. "training stopped at step 0 of
    60" (`status` "running" or "interrupted": a run killed mid-way, or an `extend --finetune-steps` child killed
    before its fine-tune ended, whose weights are still the parent's). A meta.json without a status (older runs)
    counts as finished when its step reached its steps."""
    values = meta.to_json() if isinstance(meta, RunMeta) else meta
    status, step, steps = values.get("status"), values.get("step"), values.get("steps")
    finished = status == "complete" if status is not None else True
    if finished and not (is_whole_number(step) and is_whole_number(steps) and step < steps):
        return None
    where = f"step {step} of {steps}" if is_whole_number(steps) else f"step {step}"
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
