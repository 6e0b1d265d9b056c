"""Corpus sources: the documents behind `load_corpus` and their train/validation split.

Four sources, each yielding documents that are joined with an end-of-document token:
- `data=stdlib` (default): the running Python's standard-library `.py` files, in sorted relative-path order; no
  download. A file goes to validation when sha256(relative path) maps below `data.val_fraction`.
- `data=text data.paths=[...]`: files, directories and globs read by the `datasets` `text` builder, one document per
  file; validation by a hash of the document's content, or the files in `data.val_paths`.
- `data=hf data.name=...`: `datasets.load_dataset(name, config, split=...)`, one document per row of
  `data.text_column`; validation from `data.val_split` or by content hash.
- `data=passkey`: synthetic passkey-retrieval episodes generated from `data.passkey_seed` (`posenc_cli.passkey`).

A source opens cheaply (fingerprint and summary); its documents are read only when the token cache needs them.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import platform
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from posenc_cli.config import DataConfig
from posenc_cli.errors import DataError

FORMAT_VERSION = 1  # bump when the cached layout or the splitting rule changes
BATCH_BYTES = 1 << 21  # about 2 MB of text per tokenizer call
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}

ProgressFn = Callable[[str, int, int], None]  # (stage, done, total); stages: reading, training tokenizer, ...


def stdlib_root() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def report_progress(progress: ProgressFn | None, stage: str, done: int, total: int) -> None:
    if progress is not None:
        progress(stage, done, total)


def short_hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode("utf-8")).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------------------------
# Documents and the train/validation split.


def hash_unit(key: bytes) -> float:
    """A stable pseudo-uniform number in [0, 1): the first 8 bytes of sha256(key)."""
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2.0**64


def validation_mask(scores: np.ndarray, sizes: np.ndarray, val_fraction: float) -> np.ndarray:
    """Non-empty documents with score < val_fraction go to validation (bool mask, shape of `scores`).

    With val_fraction > 0 and two or more documents, each split keeps at least one: the lowest score moves to
    validation if none did, the highest stays in training if all did.
    """
    keep = sizes > 0
    val = keep & (scores < val_fraction)
    idx = np.flatnonzero(keep)
    if val_fraction > 0 and idx.size >= 2:
        if not val.any():
            val[idx[np.argmin(scores[idx])]] = True
        if val[idx].all():
            val[idx[np.argmax(scores[idx])]] = False
    return val


def split_document(text: str, val_fraction: float) -> tuple[str, str]:
    """Hold out the last `val_fraction` of a lone document, cut at the next line start when one is near."""
    cut = int(len(text) * (1.0 - val_fraction))
    newline = text.find("\n", cut)
    if newline != -1 and newline + 1 < len(text) and newline - cut < (len(text) - cut) // 2:
        cut = newline + 1
    if cut <= 0 or cut >= len(text):
        raise DataError("the only document is too short to hold out a validation part; add data or data.val_paths")
    return text[:cut], text[cut:]


@dataclass
class _Table:
    """Documents of one origin, in order, readable in batches; with per-document size and split score."""

    read: Callable[[], Iterator[list[str]]]
    sizes: np.ndarray  # (N,) bytes of each document in its source (0: empty, never used)
    scores: np.ndarray  # (N,) stable hash in [0, 1) deciding the split


@dataclass
class Docs:
    """The documents of one split: a table and a row mask."""

    table: _Table
    mask: np.ndarray  # (N,) bool

    @property
    def count(self) -> int:
        return int(self.mask.sum())

    @property
    def nbytes(self) -> int:
        return int(self.table.sizes[self.mask].sum())

    def batches(self, batch_bytes: int | None = None) -> Iterator[list[str]]:
        """The selected documents in order, grouped into lists of about `batch_bytes` (default BATCH_BYTES)."""
        batch_bytes = batch_bytes or BATCH_BYTES
        out: list[str] = []
        size, i = 0, 0
        for batch in self.table.read():
            for doc in batch:  # one step per document
                if self.mask[i]:
                    out.append(doc)
                    size += int(self.table.sizes[i])
                    if size >= batch_bytes:
                        yield out
                        out, size = [], 0
                i += 1
        if out:
            yield out


def _memory_table(docs: list[str]) -> _Table:
    sizes = np.array([len(d.encode("utf-8")) for d in docs], dtype=np.int64)
    return _Table(read=lambda: iter([docs]), sizes=sizes, scores=np.zeros(len(docs)))


def _whole(table: _Table) -> Docs:
    return Docs(table, table.sizes > 0)


def _split_table(table: _Table, val_fraction: float, what: str) -> tuple[Docs, Docs, str]:
    """Split one table by document score; a lone document is cut into head (train) and tail (validation)."""
    keep = table.sizes > 0
    if not keep.any():
        raise DataError(f"{what} holds no non-empty documents")
    if keep.sum() == 1 and val_fraction > 0:
        index = int(np.flatnonzero(keep)[0])
        docs = [d for batch in table.read() for d in batch]
        head, tail = split_document(docs[index], val_fraction)
        return _whole(_memory_table([head])), _whole(_memory_table([tail])), "tail of the only document"
    val = validation_mask(table.scores, table.sizes, val_fraction)
    return Docs(table, keep & ~val), Docs(table, val), "document hash"


@dataclass
class Source:
    """A source opened cheaply: fingerprint and summary now, documents only when tokenization needs them."""

    fingerprint: str
    info: dict[str, Any]
    documents: Callable[[], tuple[Docs, Docs, str]]


# ----------------------------------------------------------------------------------------------------------------
# data=stdlib


def stdlib_files(root: Path) -> list[str]:
    """Relative POSIX paths of the `.py` files under `root`, sorted; skips site-/dist-packages and __pycache__."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        rel = Path(dirpath).relative_to(root)
        out.extend((rel / f).as_posix() for f in filenames if f.endswith(".py"))
    return sorted(out)


def _stdlib_source(data: DataConfig, progress: ProgressFn | None) -> Source:
    root = stdlib_root()
    if not root.is_dir():
        raise DataError(f"the standard library was not found at {root}; use data=text data.paths=[...] instead")
    rels = stdlib_files(root)
    if not rels:
        raise DataError(f"no .py files under {root}; use data=text data.paths=[...] instead")
    digest = hashlib.sha256()
    contents: list[bytes] = []
    for i, rel in enumerate(rels):
        raw = (root / rel).read_bytes()
        digest.update(rel.encode("utf-8") + b"\0" + len(raw).to_bytes(8, "little"))
        digest.update(raw)
        contents.append(raw)
        report_progress(progress, "reading", i + 1, len(rels))

    def read() -> Iterator[list[str]]:
        for start in range(0, len(contents), 64):
            yield [raw.decode("utf-8", errors="replace") for raw in contents[start : start + 64]]

    table = _Table(
        read=read,
        sizes=np.array([len(c) for c in contents], dtype=np.int64),
        scores=np.array([hash_unit(rel.encode("utf-8")) for rel in rels]),
    )
    content = digest.hexdigest()
    info = {
        "source": "stdlib",
        "root": str(root),
        "files": len(rels),
        "python_version": platform.python_version(),
        "content_sha256": content,
        "val_fraction": data.val_fraction,
    }
    return Source(
        fingerprint=short_hash("stdlib", FORMAT_VERSION, content, data.val_fraction),
        info=info,
        documents=lambda: _split_table(table, data.val_fraction, f"the standard library at {root}"),
    )


# ----------------------------------------------------------------------------------------------------------------
# data=text and data=hf (through `datasets`)


def expand_paths(patterns: Sequence[str]) -> list[Path]:
    """Files named by `patterns` (files, directories searched recursively, globs), resolved, sorted, unique.

    Hidden files and directories inside a directory are skipped. Raises `DataError` naming every pattern that
    matches no file.
    """
    files: list[Path] = []
    missing: list[str] = []
    for pattern in patterns:
        path = Path(pattern).expanduser()
        if any(ch in pattern for ch in "*?["):
            candidates = [Path(p) for p in sorted(glob.glob(str(path), recursive=True))]
        else:
            candidates = [path] if path.exists() else []
        found: list[Path] = []
        for c in candidates:
            if c.is_dir():
                found.extend(
                    f
                    for f in c.rglob("*")
                    if f.is_file() and not any(p.startswith(".") for p in f.relative_to(c).parts)
                )
            elif c.is_file():
                found.append(c)
        if found:
            files.extend(found)
        else:
            missing.append(pattern)
    if missing:
        raise DataError(f"data path{'s' if len(missing) > 1 else ''} not found or empty: {', '.join(missing)}")
    return sorted({f.resolve() for f in files}, key=str)


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """Silence `datasets`' own progress bars while it reads local files (the CLI shows its own)."""
    import datasets
    from datasets.utils import logging as ds_logging

    was_enabled = not datasets.are_progress_bars_disabled()
    verbosity = ds_logging.get_verbosity()
    datasets.disable_progress_bars()
    ds_logging.set_verbosity_error()
    try:
        yield
    finally:
        ds_logging.set_verbosity(verbosity)
        if was_enabled:
            datasets.enable_progress_bars()


def _scan_dataset(ds: Any, column: str, progress: ProgressFn | None) -> _Table:
    """Read a `datasets.Dataset` column once for document sizes and content-hash scores."""
    col = ds.select_columns([column])
    sizes: list[int] = []
    scores: list[float] = []
    for batch in col.iter(batch_size=1000):
        for text in batch[column]:
            raw = (text or "").encode("utf-8")
            sizes.append(len(raw))
            scores.append(hash_unit(raw))
        report_progress(progress, "reading", len(sizes), col.num_rows)

    def read() -> Iterator[list[str]]:
        for batch in col.iter(batch_size=1000):
            yield [t or "" for t in batch[column]]

    return _Table(read=read, sizes=np.array(sizes, dtype=np.int64), scores=np.array(scores, dtype=np.float64))


def _text_source(data: DataConfig, root: Path, progress: ProgressFn | None) -> Source:
    val_files = expand_paths(data.val_paths) if data.val_paths else []
    held_out = set(val_files)
    train_files = [f for f in expand_paths(data.paths) if f not in held_out]
    if not train_files:
        raise DataError("every file in data.paths is also in data.val_paths: nothing is left to train on")
    roles = [("train", f) for f in train_files] + [("val", f) for f in val_files]
    hashes = []
    for i, (role, f) in enumerate(roles):
        hashes.append((role, _file_sha256(f)))
        report_progress(progress, "reading", i + 1, len(roles))
    split_rule: Any = "val_paths" if val_files else data.val_fraction
    info = {
        "source": "text",
        "paths": list(data.paths),
        "val_paths": list(data.val_paths),
        "files": len(roles),
        "val_fraction": data.val_fraction,
    }

    def documents() -> tuple[Docs, Docs, str]:
        import datasets

        data_files = {"train": [str(f) for f in train_files]}
        if val_files:
            data_files["val"] = [str(f) for f in val_files]
        try:
            with _quiet_datasets():
                dd = datasets.load_dataset(
                    "text",
                    data_files=data_files,
                    sample_by="document",
                    encoding_errors="replace",
                    cache_dir=str(root / "hf"),
                )
        except OSError as e:
            raise DataError(f"could not read data.paths: {e}") from e
        train = _scan_dataset(dd["train"], "text", progress)
        if val_files:
            return _whole(train), _whole(_scan_dataset(dd["val"], "text", progress)), "data.val_paths"
        return _split_table(train, data.val_fraction, "data.paths")

    return Source(fingerprint=short_hash("text", FORMAT_VERSION, hashes, split_rule), info=info, documents=documents)


def hf_offline() -> bool:
    """Whether Hub access is switched off (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE, read now, not at import)."""
    import datasets

    env = [os.environ.get(k, "") for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")]
    return any(v.upper() in {"1", "ON", "YES", "TRUE"} for v in env) or bool(datasets.config.HF_HUB_OFFLINE)


@contextlib.contextmanager
def _offline_mode(offline: bool) -> Iterator[None]:
    """`datasets` reads the offline variables at import; honour them when they were set later (tests, notebooks)."""
    import datasets
    import huggingface_hub.constants as hub_constants

    saved = (datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    if offline:
        datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


def hub_reachable(timeout: float = 3.0) -> bool:
    """One TCP connection to the Hub's endpoint ($HF_ENDPOINT, default huggingface.co:443). Without it, `datasets`
    retries every request with back-off (about 26 s of warnings) before failing, so posenc checks once first."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout):
            return True
    except OSError:
        return False


def _load_hf(data: DataConfig, split: str) -> Any:
    import datasets

    where = f"'{data.name}'" + (f" config '{data.config}'" if data.config else "") + f" split '{split}'"
    offline = hf_offline()
    unreachable = not offline and not hub_reachable()  # then read the local cache only, without retries
    try:
        with _offline_mode(offline or unreachable):
            ds = datasets.load_dataset(data.name, data.config, split=split)
    except ValueError as e:  # unknown config or split name
        if unreachable:
            raise DataError(
                f"dataset {where} could not be fetched: the Hugging Face Hub is unreachable (no network?) and it is "
                "not in the local cache; to use local files instead: data=text data.paths=[FILE_OR_DIR,...]"
            ) from e
        raise DataError(f"dataset {where} could not be loaded: {_first_line(e)}") from e
    except Exception as e:
        reason = (
            "offline mode is on (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE) and it is not in the local cache"
            if offline
            else "the Hub is unreachable (no network?) and it is not in the local cache"
            if unreachable
            else _first_line(e)
        )
        raise DataError(
            f"dataset {where} could not be fetched from the Hugging Face Hub ({reason}); "
            "to use local files instead: data=text data.paths=[FILE_OR_DIR,...]"
        ) from e
    if not isinstance(ds, datasets.Dataset):
        raise DataError(f"dataset {where} did not load as a single table (got {type(ds).__name__})")
    column = data.text_column
    if column not in ds.column_names:
        raise DataError(
            f"data.text_column='{column}' is not a column of {where} (columns: {', '.join(ds.column_names)})"
        )
    feature = ds.features[column]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise DataError(f"data.text_column='{column}' of {where} holds {feature}, not text")
    return ds


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _hf_source(data: DataConfig, progress: ProgressFn | None) -> Source:
    report_progress(progress, "reading", 0, 1)
    ds = _load_hf(data, data.split)
    val_ds = _load_hf(data, data.val_split) if data.val_split else None
    parts = [data.name, data.config, data.split, data.val_split, data.text_column, data.val_fraction]
    parts += [getattr(d, "_fingerprint", None) for d in (ds, val_ds) if d is not None]
    parts += [d.num_rows for d in (ds, val_ds) if d is not None]
    info = {
        "source": "hf",
        "name": data.name,
        "config": data.config,
        "split": data.split,
        "val_split": data.val_split,
        "text_column": data.text_column,
        "rows": ds.num_rows + (val_ds.num_rows if val_ds is not None else 0),
        "val_fraction": data.val_fraction,
    }

    def documents() -> tuple[Docs, Docs, str]:
        train = _scan_dataset(ds, data.text_column, progress)
        if val_ds is not None:
            return _whole(train), _whole(_scan_dataset(val_ds, data.text_column, progress)), "data.val_split"
        return _split_table(train, data.val_fraction, f"dataset '{data.name}'")

    return Source(fingerprint=short_hash("hf", FORMAT_VERSION, parts), info=info, documents=documents)


def _passkey_source(data: DataConfig) -> Source:
    """data=passkey: seeded synthetic retrieval episodes (`posenc_cli.passkey`), one document each."""
    from posenc_cli.passkey import corpus_documents, corpus_info

    info = corpus_info(data)

    def documents() -> tuple[Docs, Docs, str]:
        train, val = corpus_documents(data)
        return _whole(_memory_table(train)), _whole(_memory_table(val)), "generated episodes (seeded)"

    return Source(fingerprint=short_hash("passkey", FORMAT_VERSION, info), info=info, documents=documents)


def open_source(data: DataConfig, root: Path, progress: ProgressFn | None) -> Source:
    if data.source == "stdlib":
        return _stdlib_source(data, progress)
    if data.source == "text":
        return _text_source(data, root, progress)
    if data.source == "passkey":
        return _passkey_source(data)
    return _hf_source(data, progress)
