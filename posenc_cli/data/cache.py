"""The on-disk token cache behind `load_corpus`, and batching (`window_index`, `eval_windows`).

The corpus sources (stdlib, text, hf, passkey; one module each) and their train/validation split live in
`posenc_cli.data.sources`.
Each split is tokenized once into a flat array of ids, stored as raw `uint16`/`int32` under
`<cache>/tokens/<key>/` with key = hash(source fingerprint, tokenizer fingerprint, `LAYOUT`), and memory-mapped
afterwards. Beside the ids of a split whose documents have unscored parts (`data.sources.base.Marked`: the prompts of
prompt/answer examples) lies its scored mask, one `uint8` per id (1: a target `train.loss_on=answer` trains on);
a split without one is scored everywhere. The manifest records, for a mixture whose documents tell their task
(`Marked.kind`), each task's longest training prompt (`Corpus.info["longest_prompt_by_task"]`: the competence gate's
bound, task by task). Arrays are written atomically and the manifest last: an entry without a matching manifest is
never trusted.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posenc_cli.config import DataConfig, TokenizerConfig
from posenc_cli.data.examples import NO_PROMPT, example_prompts, find_examples
from posenc_cli.data.sources import open_source
from posenc_cli.data.sources.base import (
    BATCH_BYTES,
    FORMAT_VERSION,
    Docs,
    ProgressFn,
    Source,
    Stream,
    is_validation,
    report_progress,
    short_hash,
)
from posenc_cli.data.tokenizer import (
    BPETokenizer,
    ByteTokenizer,
    Tokenizer,
    check_token_bytes,
    load_tokenizer,
    train_bpe,
)
from posenc_cli.errors import CheckpointError, DataError, UserError
from posenc_cli.fsutil import atomic_path, atomic_write_json, atomic_write_text, write_all
from posenc_cli.untrusted import load_json

__all__ = [
    "Corpus",
    "cache_root",
    "document_starts",
    "eval_windows",
    "load_corpus",
    "window_index",
]


MANIFEST = "manifest.json"
SPLITS = ("train", "val")
BPE_TRAIN_BYTES = 4_000_000  # BPE is trained on an evenly strided sample of about this much training text
BATCH_TOKENS = 1 << 22  # ones written at a time when a mask starts after unmasked documents
LAYOUT = 3  # bump when an entry's files change (2: the scored mask beside the ids; 3: each task's longest prompt)


@dataclass
class Corpus:
    """Token ids of both splits (1-D, memory-mapped), the tokenizer that made them, a JSON-safe summary, and each
    split's scored mask (1-D uint8 beside the ids, memory-mapped; None: every token scored)."""

    train: np.ndarray
    val: np.ndarray
    tokenizer: Tokenizer
    info: dict[str, Any]
    train_scored: np.ndarray | None = None
    val_scored: np.ndarray | None = None


def cache_root(data: DataConfig) -> Path:
    """`data.cache_dir`, else `$POSENC_CACHE_DIR`, else `outputs/.cache` under the current directory."""
    if data.cache_dir:
        return Path(data.cache_dir).expanduser()
    env = os.environ.get("POSENC_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.cwd() / "outputs" / ".cache"


# ----------------------------------------------------------------------------------------------------------------
# Tokenizer for a corpus, token cache.


def _bpe_sample(train: Docs, budget: int = BPE_TRAIN_BYTES) -> Iterator[str]:
    """Every k-th training document (k spreads the sample over the corpus), each at most `budget` characters."""
    k = max(1, -(-train.nbytes // budget))
    i = 0
    for batch in train.batches():
        for doc in batch:
            if i % k == 0:
                yield doc[:budget]
            i += 1


def _corpus_tokenizer(
    tok: TokenizerConfig, source: Source, docs: Callable[[], tuple[Docs, Docs, str]], root: Path, progress: Any
) -> Tokenizer:
    """Bytes, or BPE trained on this corpus's training split and cached by (corpus fingerprint, vocab size)."""
    if tok.kind == "byte":
        return ByteTokenizer()
    if tok.kind == "hf":
        return load_tokenizer(tok)  # pretrained: tokenizer.path, checked against tokenizer.sha256
    path = root / "tokenizers" / f"bpe-{source.fingerprint}-{tok.vocab_size}.json"
    if path.is_file():
        with contextlib.suppress(CheckpointError):  # a damaged cache file is retrained
            return BPETokenizer.from_file(path)
    train, _, _ = docs()
    report_progress(progress, "training tokenizer", 0, 1)
    sample = _stream_head(train) if source.stream is not None else _bpe_sample(train)  # a stream's size is unknown
    bpe = train_bpe(sample, tok.vocab_size)
    atomic_write_text(path, bpe.to_json())
    report_progress(progress, "training tokenizer", 1, 1)
    return bpe


def _stream_head(train: Any, budget: int = BPE_TRAIN_BYTES) -> Iterator[str]:
    """The first training documents of a stream, about `budget` characters in all."""
    size = 0
    for batch in train.batches():
        for doc in batch:
            yield doc[: budget - size]
            size += len(doc)
            if size >= budget:
                return


def tokenize(tokenizer: Tokenizer, docs: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Ids of `docs`, each followed by end-of-document, and their scored marks (uint8; `Tokenizer.encode_scored`):
    the one place the cache builder tokenizes."""
    return tokenizer.encode_scored(docs)


def longest_prompts_by_kind(docs: Sequence[str], ids: np.ndarray, scored: np.ndarray, eod_id: int) -> dict[str, int]:
    """{kind: its longest prompt} over the documents of one tokenized batch that tell their task (`Marked.kind`);
    `ids`, `scored` the batch's tokens (each document followed by end-of-document: `tokenize`). A prompt as
    `data.examples.example_prompts` counts it; empty when no document tells its task."""
    kinds = [getattr(doc, "kind", None) for doc in docs]
    if not any(kinds):
        return {}
    examples = find_examples(ids, eod_id)
    if examples.ends.size != len(docs):  # an end-of-document id inside a document: the spans are not the documents
        return {}
    out: dict[str, int] = {}
    for kind, prompt in zip(kinds, example_prompts(examples, scored).tolist(), strict=True):
        if kind is not None and prompt != NO_PROMPT:
            out[kind] = max(out.get(kind, 0), int(prompt))
    return out


def merge_longest(into: dict[str, int], more: dict[str, int]) -> None:
    for kind, n in more.items():
        into[kind] = max(into.get(kind, 0), n)


def write_ids(f: Any, ids: np.ndarray) -> None:
    """Append `ids` to the open split file `f`: every byte, or an `OSError` with errno (`fsutil.write_all`; numpy's
    `tofile` reports a short write on a full disk without errno, which read as a bug instead of a full disk)."""
    write_all(f, np.ascontiguousarray(ids))


def _cache_key(source_fp: str, tokenizer_fp: str) -> str:
    return short_hash("tokens", FORMAT_VERSION, LAYOUT, source_fp, tokenizer_fp)


def read_manifest(entry: Path, key: str) -> dict[str, Any] | None:
    """The manifest of a complete cache entry, or None when anything is missing or does not match."""
    try:
        manifest = load_json(entry / MANIFEST, what="token cache manifest", max_bytes=2**20, error=DataError)
        if manifest["format"] != FORMAT_VERSION or manifest.get("layout") != LAYOUT or manifest["key"] != key:
            return None
        itemsize = np.dtype(manifest["dtype"]).itemsize
        for split in SPLITS:
            meta = manifest["splits"][split]
            if (entry / meta["file"]).stat().st_size != meta["tokens"] * itemsize:
                return None
            if meta["scored_file"] is not None and (entry / meta["scored_file"]).stat().st_size != meta["tokens"]:
                return None
    except (UserError, OSError, ValueError, KeyError, TypeError):
        return None
    return manifest


def _build_entry(
    entry: Path, key: str, train: Docs, val: Docs, method: str, tokenizer: Tokenizer, progress: ProgressFn | None
) -> dict[str, Any]:
    """Tokenize both splits into `entry` (streamed, atomic per file), then write the manifest last."""
    t0 = time.perf_counter()
    entry.mkdir(parents=True, exist_ok=True)
    (entry / MANIFEST).unlink(missing_ok=True)
    total = train.count + val.count
    done = 0
    splits: dict[str, Any] = {}
    for i, (name, docs) in enumerate((("train", train), ("val", val))):
        n_tokens = n_bytes = n_scored = 0
        prompts: dict[str, int] = {}  # each task's longest prompt (a mixture whose documents tell their task)
        mask_path = entry / f"{name}.scored.bin"
        mask_path.unlink(missing_ok=True)
        with contextlib.ExitStack() as files:
            f = files.enter_context(open(files.enter_context(atomic_path(entry / f"{name}.bin")), "wb"))
            mask_f = None  # opened at the first unscored token, with ones for the tokens before it
            for batch in docs.batches():
                ids, scored = tokenize(tokenizer, batch)
                write_ids(f, ids.astype(tokenizer.dtype, copy=False))
                if mask_f is None and not scored.all():
                    mask_f = files.enter_context(open(files.enter_context(atomic_path(mask_path)), "wb"))
                    for at in range(0, n_tokens, BATCH_TOKENS):
                        write_ids(mask_f, np.ones(min(BATCH_TOKENS, n_tokens - at), dtype=np.uint8))
                if mask_f is not None:
                    write_ids(mask_f, scored)
                n_tokens += int(ids.size)
                n_bytes += check_token_bytes(tokenizer, batch, ids)  # the text's bytes, which its tokens add up to
                n_scored += int(scored.sum())
                merge_longest(prompts, longest_prompts_by_kind(batch, ids, scored, tokenizer.eod_id))
                done += len(batch)
                report_progress(progress, "tokenizing", done, total)
        masked = n_scored < n_tokens  # a split scored everywhere keeps no mask
        splits[name] = {
            "file": f"{name}.bin",
            "documents": docs.count,
            "tokens": n_tokens,
            "bytes": n_bytes,
            "scored_file": mask_path.name if masked else None,
            "scored_tokens": n_scored,
            "longest_prompt_by_task": dict(sorted(prompts.items())) or None,
        }
        report_progress(progress, "writing", i + 1, 3)
    manifest = {
        "format": FORMAT_VERSION,
        "layout": LAYOUT,
        "key": key,
        "dtype": tokenizer.dtype.name,
        "split_method": method,
        "tokenizer": {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size, "fingerprint": tokenizer.fingerprint},
        "splits": splits,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    atomic_write_json(entry / MANIFEST, manifest)
    report_progress(progress, "writing", 3, 3)
    return manifest


def _byte_batches(read: Callable[[], Iterator[list[str]]]) -> Iterator[list[str]]:
    """The non-empty documents of `read()` regrouped into lists of about `BATCH_BYTES` characters."""
    out: list[str] = []
    size = 0
    for batch in read():
        for doc in batch:  # one step per document
            if doc:
                out.append(doc)
                size += len(doc)
        if size >= BATCH_BYTES:
            yield out
            out, size = [], 0
    if out:
        yield out


def _cut(ids: dict[str, np.ndarray], room: int) -> dict[str, np.ndarray]:
    """Keep `room` of the ids of both splits, shared in proportion to their sizes (the validation part rounded)."""
    total = sum(a.size for a in ids.values())
    if total <= room:
        return ids
    keep_val = round(room * ids["val"].size / total)
    return {"train": ids["train"][: room - keep_val], "val": ids["val"][:keep_val]}


def _build_stream_entry(
    entry: Path, key: str, stream: Stream, tokenizer: Tokenizer, progress: ProgressFn | None
) -> dict[str, Any]:
    """Tokenize a `Stream` into `entry` in one pass for both splits, stopping at its budget; the manifest also keeps
    `content_sha256`, a hash of the ids written (what was read, as tokens). Memory: one batch of text at a time."""
    t0 = time.perf_counter()
    entry.mkdir(parents=True, exist_ok=True)
    (entry / MANIFEST).unlink(missing_ok=True)
    budget = stream.max_tokens
    if stream.read_val is None:
        phases = [(stream.read, None, budget)]  # both splits from one stream, by document hash
        method = "document hash (streamed)"
    else:
        val_budget = None if budget is None else max(1, round(budget * stream.val_fraction))
        phases = [
            (stream.read, "train", None if budget is None else budget - val_budget),
            (stream.read_val, "val", val_budget),
        ]
        method = "data.val_split"
    counts = {s: {"documents": 0, "tokens": 0, "bytes": 0} for s in SPLITS}
    digests = {s: hashlib.sha256() for s in SPLITS}
    with contextlib.ExitStack() as files:
        out = {s: files.enter_context(open(files.enter_context(atomic_path(entry / f"{s}.bin")), "wb")) for s in SPLITS}
        for read, only, limit in phases:
            written = 0
            for batch in _byte_batches(read):
                groups: dict[str, list[str]] = {"train": [], "val": []}
                for doc in batch:  # one step per document
                    groups[only or ("val" if is_validation(doc, stream.val_fraction) else "train")].append(doc)
                ids = {s: tokenizer.encode_documents(groups[s]) for s in SPLITS}
                n_bytes = {s: check_token_bytes(tokenizer, groups[s], ids[s]) for s in SPLITS}
                room = None if limit is None else limit - written
                if room is not None and room < sum(a.size for a in ids.values()):
                    ids = _cut(ids, room)
                    n_bytes = {s: int(tokenizer.token_bytes[ids[s]].sum()) for s in SPLITS}
                for s in SPLITS:
                    if ids[s].size == 0:
                        continue
                    write_ids(out[s], ids[s].astype(tokenizer.dtype, copy=False))
                    digests[s].update(np.ascontiguousarray(ids[s].astype(tokenizer.dtype, copy=False)).tobytes())
                    ends = int((ids[s] == tokenizer.eod_id).sum())
                    counts[s]["documents"] += ends + int(ids[s][-1] != tokenizer.eod_id)  # a document cut short
                    counts[s]["tokens"] += int(ids[s].size)
                    counts[s]["bytes"] += n_bytes[s]
                    written += int(ids[s].size)
                report_progress(progress, "tokenizing", written, limit or written)
                if limit is not None and written >= limit:
                    break
    if counts["train"]["tokens"] == 0:
        raise DataError("the stream gave no training text (an empty dataset, or data.text_column holds only blanks)")
    if counts["val"]["tokens"] == 0 and stream.val_fraction > 0:
        raise DataError(
            "no document of the stream went to validation before the budget ran out: raise data.max_tokens or "
            "data.val_fraction, or give data.val_split"
        )
    splits = {
        s: {**counts[s], "file": f"{s}.bin", "scored_file": None, "scored_tokens": counts[s]["tokens"]} for s in SPLITS
    }
    content = hashlib.sha256("".join(digests[s].hexdigest() for s in SPLITS).encode()).hexdigest()
    manifest = {
        "format": FORMAT_VERSION,
        "layout": LAYOUT,
        "key": key,
        "dtype": tokenizer.dtype.name,
        "split_method": method,
        "tokenizer": {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size, "fingerprint": tokenizer.fingerprint},
        "splits": splits,
        "max_tokens": budget,
        "content_sha256": content,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    atomic_write_json(entry / MANIFEST, manifest)
    report_progress(progress, "writing", 3, 3)
    return manifest


def _open_split(entry: Path, manifest: dict[str, Any], split: str) -> np.ndarray:
    meta = manifest["splits"][split]
    dtype = np.dtype(manifest["dtype"])
    if meta["tokens"] == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(entry / meta["file"], dtype=dtype, mode="r", shape=(meta["tokens"],))


def _open_scored(entry: Path, manifest: dict[str, Any], split: str) -> np.ndarray | None:
    """The split's scored mask (uint8, one per id), None when every token is scored."""
    meta = manifest["splits"][split]
    if meta["scored_file"] is None:
        return None
    return np.memmap(entry / meta["scored_file"], dtype=np.uint8, mode="r", shape=(meta["tokens"],))


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
    source = open_source(data, root, progress)
    docs = functools.cache(source.documents)
    if tokenizer is None:
        tokenizer = _corpus_tokenizer(tok, source, docs, root, progress)
    key = _cache_key(source.fingerprint, tokenizer.fingerprint)
    entry = root / "tokens" / key
    manifest = read_manifest(entry, key)
    reused = manifest is not None
    if manifest is None and source.stream is not None:
        manifest = _build_stream_entry(entry, key, source.stream, tokenizer, progress)
    elif manifest is None:
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
        "scored_tokens": {s: splits[s]["scored_tokens"] for s in SPLITS},
        "tokenizer": tokenizer.kind,
        "vocab_size": tokenizer.vocab_size,
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "dtype": manifest["dtype"],
        "cache_path": str(entry),
        "reused": reused,
    }
    if splits["train"].get("longest_prompt_by_task"):  # a mixture of tasks: what each task's 1× prompt may reach
        info["longest_prompt_by_task"] = splits["train"]["longest_prompt_by_task"]
    if "content_sha256" in manifest:  # a streamed corpus: what was read, as tokens
        info["content_sha256"] = manifest["content_sha256"]
    info.setdefault("python_version", platform.python_version())
    info["seconds"] = round(time.perf_counter() - t0, 3)
    return Corpus(
        _open_split(entry, manifest, "train"),
        _open_split(entry, manifest, "val"),
        tokenizer,
        info,
        train_scored=_open_scored(entry, manifest, "train"),
        val_scored=_open_scored(entry, manifest, "val"),
    )


# ----------------------------------------------------------------------------------------------------------------
# Batching.


def window_index(
    n: int, batch_size: int, seq_len: int, generator: torch.Generator, starts: np.ndarray | None = None
) -> np.ndarray:
    """The offsets (B, seq_len + 1) of a training batch's windows into a split of `n` tokens: uniform over
    [0, n - seq_len - 1], or over `starts` (`document_starts`) when given, drawn with `generator` (same state, same
    batch)."""
    if n < seq_len + 1:
        raise DataError(f"the split has {n} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    if starts is None:
        offsets = torch.randint(0, n - seq_len, (batch_size,), generator=generator, device=generator.device)
        return offsets.cpu().numpy()[:, None] + np.arange(seq_len + 1)  # (B, T+1)
    pick = torch.randint(0, len(starts), (batch_size,), generator=generator, device=generator.device)
    return starts[pick.cpu().numpy()][:, None] + np.arange(seq_len + 1)  # (B, T+1)


def document_starts(tokens: np.ndarray, eod_id: int, seq_len: int) -> np.ndarray:
    """Offsets of the end-of-document tokens that have seq_len more tokens after them, int64: a window starting there
    opens with a whole document at positions 1.. after its `<eod>`, as an evaluation prompt does (`train.window_start=
    document`). DataError when there is none (a corpus of one document, or documents longer than the split allows)."""
    n = len(tokens)
    offsets = np.flatnonzero(np.asarray(tokens[: max(n - seq_len, 0)]) == eod_id).astype(np.int64)
    if offsets.size == 0:
        raise DataError(
            f"train.window_start=document: no end-of-document token of the training split has {seq_len} tokens after "
            "it (train.window_start=uniform samples any offset)"
        )
    return offsets


def eval_windows(tokens: np.ndarray, length: int, stride: int, max_windows: int | None = None) -> torch.Tensor:
    """Evaluation windows (N, length + 1) int64: window k = tokens[k*stride : k*stride + length + 1].

    N = 1 + (len - length - 1) // stride, capped at `max_windows`. With stride = length, windows share one
    boundary token, so every token after the first is a target exactly once (non-overlapping inputs).
    """
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
