"""Corpora, the on-disk token cache, and batching.

Four sources behind `load_corpus`, each yielding documents that are joined with an end-of-document token:
- `data=stdlib` (default): the running Python's standard-library `.py` files, in sorted relative-path order; no
  download. A file goes to validation when sha256(relative path) maps below `data.val_fraction`.
- `data=text data.paths=[...]`: files, directories and globs read by the `datasets` `text` builder, one document per
  file; validation by a hash of the document's content, or the files in `data.val_paths`.
- `data=hf data.name=...`: `datasets.load_dataset(name, config, split=...)`, one document per row of
  `data.text_column`; validation from `data.val_split` or by content hash.
- `data=passkey`: synthetic passkey-retrieval episodes generated from `data.passkey_seed` (`posenc_cli.passkey`).

Each split is tokenized once into a flat array of ids, stored as raw `uint16`/`int32` under
`<cache>/tokens/<key>/` with key = hash(source fingerprint, tokenizer fingerprint), and memory-mapped afterwards.
Arrays are written atomically and the manifest last: an entry without a matching manifest is never trusted.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import json
import os
import platform
import sysconfig
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from posenc_cli.config import DataConfig, TokenizerConfig
from posenc_cli.errors import CheckpointError, DataError
from posenc_cli.fsutil import atomic_path, atomic_write_json, atomic_write_text
from posenc_cli.tokenizer import (
    EOD_TOKEN,
    BPETokenizer,
    ByteTokenizer,
    Tokenizer,
    load_tokenizer,
    token_dtype,
    train_bpe,
)

__all__ = [
    "EOD_TOKEN",
    "BPETokenizer",
    "ByteTokenizer",
    "Corpus",
    "Tokenizer",
    "cache_root",
    "eval_windows",
    "expand_paths",
    "load_corpus",
    "load_tokenizer",
    "sample_batch",
    "stdlib_files",
    "stdlib_root",
    "token_dtype",
]

if TYPE_CHECKING:
    import torch

FORMAT_VERSION = 1  # bump when the cached layout or the splitting rule changes
MANIFEST = "manifest.json"
SPLITS = ("train", "val")
BATCH_BYTES = 1 << 21  # about 2 MB of text per tokenizer call
BPE_TRAIN_BYTES = 4_000_000  # BPE is trained on an evenly strided sample of about this much training text
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}

ProgressFn = Callable[[str, int, int], None]  # (stage, done, total); stages: reading, training tokenizer, ...


@dataclass
class Corpus:
    """Token ids of both splits (1-D, memory-mapped), the tokenizer that made them, and a JSON-safe summary."""

    train: np.ndarray
    val: np.ndarray
    tokenizer: Tokenizer
    info: dict[str, Any]


def stdlib_root() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def cache_root(data: DataConfig) -> Path:
    """`data.cache_dir`, else `$POSENC_CACHE_DIR`, else `outputs/.cache` under the current directory."""
    if data.cache_dir:
        return Path(data.cache_dir).expanduser()
    env = os.environ.get("POSENC_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.cwd() / "outputs" / ".cache"


def _report(progress: ProgressFn | None, stage: str, done: int, total: int) -> None:
    if progress is not None:
        progress(stage, done, total)


def _digest(*parts: Any) -> str:
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
class _Docs:
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


def _whole(table: _Table) -> _Docs:
    return _Docs(table, table.sizes > 0)


def _split_table(table: _Table, val_fraction: float, what: str) -> tuple[_Docs, _Docs, str]:
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
    return _Docs(table, keep & ~val), _Docs(table, val), "document hash"


@dataclass
class _Source:
    """A source opened cheaply: fingerprint and summary now, documents only when tokenization needs them."""

    fingerprint: str
    info: dict[str, Any]
    documents: Callable[[], tuple[_Docs, _Docs, str]]


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


def _stdlib_source(data: DataConfig, progress: ProgressFn | None) -> _Source:
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
        _report(progress, "reading", i + 1, len(rels))

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
    return _Source(
        fingerprint=_digest("stdlib", FORMAT_VERSION, content, data.val_fraction),
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
        _report(progress, "reading", len(sizes), col.num_rows)

    def read() -> Iterator[list[str]]:
        for batch in col.iter(batch_size=1000):
            yield [t or "" for t in batch[column]]

    return _Table(read=read, sizes=np.array(sizes, dtype=np.int64), scores=np.array(scores, dtype=np.float64))


def _text_source(data: DataConfig, root: Path, progress: ProgressFn | None) -> _Source:
    val_files = expand_paths(data.val_paths) if data.val_paths else []
    held_out = set(val_files)
    train_files = [f for f in expand_paths(data.paths) if f not in held_out]
    if not train_files:
        raise DataError("every file in data.paths is also in data.val_paths: nothing is left to train on")
    roles = [("train", f) for f in train_files] + [("val", f) for f in val_files]
    hashes = []
    for i, (role, f) in enumerate(roles):
        hashes.append((role, _file_sha256(f)))
        _report(progress, "reading", i + 1, len(roles))
    split_rule: Any = "val_paths" if val_files else data.val_fraction
    info = {
        "source": "text",
        "paths": list(data.paths),
        "val_paths": list(data.val_paths),
        "files": len(roles),
        "val_fraction": data.val_fraction,
    }

    def documents() -> tuple[_Docs, _Docs, str]:
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

    return _Source(fingerprint=_digest("text", FORMAT_VERSION, hashes, split_rule), info=info, documents=documents)


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


def _load_hf(data: DataConfig, split: str) -> Any:
    import datasets

    where = f"'{data.name}'" + (f" config '{data.config}'" if data.config else "") + f" split '{split}'"
    offline = hf_offline()
    try:
        with _offline_mode(offline):
            ds = datasets.load_dataset(data.name, data.config, split=split)
    except ValueError as e:  # unknown config or split name
        raise DataError(f"dataset {where} could not be loaded: {_first_line(e)}") from e
    except Exception as e:
        reason = (
            "offline mode is on (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE) and it is not in the local cache"
            if offline
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


def _hf_source(data: DataConfig, progress: ProgressFn | None) -> _Source:
    _report(progress, "reading", 0, 1)
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

    def documents() -> tuple[_Docs, _Docs, str]:
        train = _scan_dataset(ds, data.text_column, progress)
        if val_ds is not None:
            return _whole(train), _whole(_scan_dataset(val_ds, data.text_column, progress)), "data.val_split"
        return _split_table(train, data.val_fraction, f"dataset '{data.name}'")

    return _Source(fingerprint=_digest("hf", FORMAT_VERSION, parts), info=info, documents=documents)


def _passkey_source(data: DataConfig) -> _Source:
    """data=passkey: seeded synthetic retrieval episodes (`posenc_cli.passkey`), one document each."""
    from posenc_cli.passkey import corpus_documents, corpus_info

    info = corpus_info(data)

    def documents() -> tuple[_Docs, _Docs, str]:
        train, val = corpus_documents(data)
        return _whole(_memory_table(train)), _whole(_memory_table(val)), "generated episodes (seeded)"

    return _Source(fingerprint=_digest("passkey", FORMAT_VERSION, info), info=info, documents=documents)


def _open_source(data: DataConfig, root: Path, progress: ProgressFn | None) -> _Source:
    if data.source == "stdlib":
        return _stdlib_source(data, progress)
    if data.source == "text":
        return _text_source(data, root, progress)
    if data.source == "passkey":
        return _passkey_source(data)
    return _hf_source(data, progress)


# ----------------------------------------------------------------------------------------------------------------
# Tokenizer for a corpus, token cache.


def _bpe_sample(train: _Docs, budget: int = BPE_TRAIN_BYTES) -> Iterator[str]:
    """Every k-th training document (k spreads the sample over the corpus), each at most `budget` characters."""
    k = max(1, -(-train.nbytes // budget))
    i = 0
    for batch in train.batches():
        for doc in batch:
            if i % k == 0:
                yield doc[:budget]
            i += 1


def _corpus_tokenizer(
    tok: TokenizerConfig, source: _Source, docs: Callable[[], tuple[_Docs, _Docs, str]], root: Path, progress: Any
) -> Tokenizer:
    """Bytes, or BPE trained on this corpus's training split and cached by (corpus fingerprint, vocab size)."""
    if tok.kind == "byte":
        return ByteTokenizer()
    path = root / "tokenizers" / f"bpe-{source.fingerprint}-{tok.vocab_size}.json"
    if path.is_file():
        with contextlib.suppress(CheckpointError):  # a damaged cache file is retrained
            return BPETokenizer.from_file(path)
    train, _, _ = docs()
    _report(progress, "training tokenizer", 0, 1)
    bpe = train_bpe(_bpe_sample(train), tok.vocab_size)
    atomic_write_text(path, bpe.to_json())
    _report(progress, "training tokenizer", 1, 1)
    return bpe


def tokenize(tokenizer: Tokenizer, docs: Sequence[str]) -> np.ndarray:
    """Ids of `docs`, each followed by end-of-document (the one place the cache builder tokenizes)."""
    return tokenizer.encode_documents(docs)


def _cache_key(source_fp: str, tokenizer_fp: str) -> str:
    return _digest("tokens", FORMAT_VERSION, source_fp, tokenizer_fp)


def read_manifest(entry: Path, key: str) -> dict[str, Any] | None:
    """The manifest of a complete cache entry, or None when anything is missing or does not match."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
        if manifest["format"] != FORMAT_VERSION or manifest["key"] != key:
            return None
        itemsize = np.dtype(manifest["dtype"]).itemsize
        for split in SPLITS:
            meta = manifest["splits"][split]
            if (entry / meta["file"]).stat().st_size != meta["tokens"] * itemsize:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return manifest


def _build_entry(
    entry: Path, key: str, train: _Docs, val: _Docs, method: str, tokenizer: Tokenizer, progress: ProgressFn | None
) -> dict[str, Any]:
    """Tokenize both splits into `entry` (streamed, atomic per file), then write the manifest last."""
    t0 = time.perf_counter()
    entry.mkdir(parents=True, exist_ok=True)
    (entry / MANIFEST).unlink(missing_ok=True)
    total = train.count + val.count
    done = 0
    splits: dict[str, Any] = {}
    for i, (name, docs) in enumerate((("train", train), ("val", val))):
        n_tokens = n_bytes = 0
        with atomic_path(entry / f"{name}.bin") as tmp, open(tmp, "wb") as f:
            for batch in docs.batches():
                ids = tokenize(tokenizer, batch)
                ids.astype(tokenizer.dtype, copy=False).tofile(f)
                n_tokens += int(ids.size)
                n_bytes += int(tokenizer.token_bytes[ids].sum())
                done += len(batch)
                _report(progress, "tokenizing", done, total)
        splits[name] = {"file": f"{name}.bin", "documents": docs.count, "tokens": n_tokens, "bytes": n_bytes}
        _report(progress, "writing", i + 1, 3)
    manifest = {
        "format": FORMAT_VERSION,
        "key": key,
        "dtype": tokenizer.dtype.name,
        "split_method": method,
        "tokenizer": {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size, "fingerprint": tokenizer.fingerprint},
        "splits": splits,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    atomic_write_json(entry / MANIFEST, manifest)
    _report(progress, "writing", 3, 3)
    return manifest


def _open_split(entry: Path, manifest: dict[str, Any], split: str) -> np.ndarray:
    meta = manifest["splits"][split]
    dtype = np.dtype(manifest["dtype"])
    if meta["tokens"] == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(entry / meta["file"], dtype=dtype, mode="r", shape=(meta["tokens"],))


def load_corpus(
    data: DataConfig,
    tok: TokenizerConfig,
    *,
    tokenizer: Tokenizer | None = None,
    progress: ProgressFn | None = None,
) -> Corpus:
    """Open a source, get its tokenizer (given, cached or trained), and tokenize it unless the cache has it.

    `tokenizer` given (e.g. a run's own) => it is used as is. `progress(stage, done, total)` is called with stages
    "reading", "training tokenizer", "tokenizing", "writing".
    """
    t0 = time.perf_counter()
    root = cache_root(data)
    source = _open_source(data, root, progress)
    docs = functools.cache(source.documents)
    if tokenizer is None:
        tokenizer = _corpus_tokenizer(tok, source, docs, root, progress)
    key = _cache_key(source.fingerprint, tokenizer.fingerprint)
    entry = root / "tokens" / key
    manifest = read_manifest(entry, key)
    reused = manifest is not None
    if manifest is None:
        train_docs, val_docs, method = docs()
        manifest = _build_entry(entry, key, train_docs, val_docs, method, tokenizer, progress)
    splits = manifest["splits"]
    info = {
        **source.info,
        "fingerprint": source.fingerprint,
        "split_method": manifest["split_method"],
        "documents": {s: splits[s]["documents"] for s in SPLITS},
        "bytes": {s: splits[s]["bytes"] for s in SPLITS},
        "tokens": {s: splits[s]["tokens"] for s in SPLITS},
        "tokenizer": tokenizer.kind,
        "vocab_size": tokenizer.vocab_size,
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "dtype": manifest["dtype"],
        "cache_path": str(entry),
        "reused": reused,
    }
    info.setdefault("python_version", platform.python_version())
    info["seconds"] = round(time.perf_counter() - t0, 3)
    return Corpus(_open_split(entry, manifest, "train"), _open_split(entry, manifest, "val"), tokenizer, info)


# ----------------------------------------------------------------------------------------------------------------
# Batching.


def sample_batch(
    tokens: np.ndarray, batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of seq_len + 1 tokens; x = window[:-1], y = window[1:], both (B, seq_len) int64.

    Start offsets are uniform over [0, len - seq_len - 1], drawn with `generator` (same state => same batch).
    """
    import torch

    n = len(tokens)
    if n < seq_len + 1:
        raise DataError(f"the split has {n} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    starts = torch.randint(0, n - seq_len, (batch_size,), generator=generator, device=generator.device)
    index = starts.cpu().numpy()[:, None] + np.arange(seq_len + 1)  # (B, T+1)
    windows = torch.from_numpy(np.asarray(tokens[index]).astype(np.int64))  # (B, T+1)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def eval_windows(tokens: np.ndarray, length: int, stride: int, max_windows: int | None = None) -> torch.Tensor:
    """Evaluation windows (N, length + 1) int64: window k = tokens[k*stride : k*stride + length + 1].

    N = 1 + (len - length - 1) // stride, capped at `max_windows`. With stride = length, windows share one
    boundary token, so every token after the first is a target exactly once (non-overlapping inputs).
    """
    import torch

    if length < 1 or stride < 1:
        raise ValueError("length and stride must be >= 1")
    n = len(tokens)
    if n < length + 1:
        raise DataError(f"the split has {n} tokens, fewer than one window of {length} + 1")
    count = 1 + (n - length - 1) // stride
    if max_windows is not None:
        count = min(count, max_windows)
    index = np.arange(count)[:, None] * stride + np.arange(length + 1)  # (N, length+1)
    return torch.from_numpy(np.asarray(tokens[index]).astype(np.int64))
