"""What every data source shares: documents, the train/validation split, the opened `Source`, the `DataSource` base.

A data source is one module of this package (`stdlib`, `text`, `hf`, `passkey`, ...) holding its config dataclass
(a subclass of `config.DataConfig`, selected by `data.source`) and a `DataSource` subclass registered with
`posenc_cli.data.sources.register`. Each yields documents that are joined with an end-of-document token. A source opens
cheaply (fingerprint and summary); its documents are read only when the token cache needs them.

A document is a `str`, every token of it scored (trained on under `train.loss_on=answer` as under `all`), or a
`Marked` str whose pieces say which parts are scored: `prompt_answer(prompt, answer)` for a prompt/answer example.
The end-of-document token after a document is scored when its last piece is (the model learns to stop).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from posenc_cli.config import DataConfig
from posenc_cli.errors import DataError

FORMAT_VERSION = 1  # bump when the cached layout or the splitting rule changes
BATCH_BYTES = 1 << 21  # about 2 MB of text per tokenizer call

ProgressFn = Callable[[str, int, int], None]  # (stage, done, total); stages: reading, training tokenizer, ...


def report_progress(progress: ProgressFn | None, stage: str, done: int, total: int) -> None:
    if progress is not None:
        progress(stage, done, total)


def short_hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode("utf-8")).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------------------------
# Documents and the train/validation split.


class Marked(str):
    """A document made of (text, scored) pieces. Its value is the whole text, so everything that reads documents as
    text (sizes, BPE training, splitting) is unchanged; the token cache reads `pieces` to store which tokens are scored
    (`train.loss_on=answer`), and `kind` (the task an example of a mixture belongs to, None: untold) to record each
    task's longest prompt. Slicing or joining gives a plain `str` (every token scored)."""

    pieces: tuple[tuple[str, bool], ...]
    kind: str | None

    def __new__(cls, *pieces: tuple[str, bool], kind: str | None = None) -> Marked:
        doc = super().__new__(cls, "".join(text for text, _ in pieces))
        doc.pieces = tuple((str(text), bool(scored)) for text, scored in pieces)
        doc.kind = kind
        return doc

    def __reduce__(self) -> tuple[Any, ...]:
        return (_marked, (self.pieces, self.kind))


def _marked(pieces: tuple[tuple[str, bool], ...], kind: str | None) -> Marked:
    return Marked(*pieces, kind=kind)


def prompt_answer(prompt: str, answer: str, kind: str | None = None) -> Marked:
    """A prompt/answer example of task `kind`: only the answer (with its leading space, as the evaluations generate
    it) is scored, and so is the end-of-document token after it (McGill-NLP/length-generalization 40f8a44, `src/data/
    s2s_dl_factory.py:343-370`: target = output + EOS, the prompt's labels -100 under `decoder_only_mask_inputs`)."""
    return Marked((prompt, False), (answer, True), kind=kind)


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
class Table:
    """Documents of one origin, in order, readable in batches; with per-document size and split score."""

    read: Callable[[], Iterator[list[str]]]
    sizes: np.ndarray  # (N,) bytes of each document in its source (0: empty, never used)
    scores: np.ndarray  # (N,) stable hash in [0, 1) deciding the split


@dataclass
class Docs:
    """The documents of one split: a table and a row mask."""

    table: Table
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


def memory_table(docs: list[str]) -> Table:
    sizes = np.array([len(d.encode("utf-8")) for d in docs], dtype=np.int64)
    return Table(read=lambda: iter([docs]), sizes=sizes, scores=np.zeros(len(docs)))


def whole(table: Table) -> Docs:
    return Docs(table, table.sizes > 0)


def split_table(table: Table, val_fraction: float, what: str) -> tuple[Docs, Docs, str]:
    """Split one table by document score; a lone document is cut into head (train) and tail (validation)."""
    keep = table.sizes > 0
    if not keep.any():
        raise DataError(f"{what} holds no non-empty documents")
    if keep.sum() == 1 and val_fraction > 0:
        index = int(np.flatnonzero(keep)[0])
        docs = [d for batch in table.read() for d in batch]
        head, tail = split_document(docs[index], val_fraction)
        return whole(memory_table([head])), whole(memory_table([tail])), "tail of the only document"
    val = validation_mask(table.scores, table.sizes, val_fraction)
    return Docs(table, keep & ~val), Docs(table, val), "document hash"


def is_validation(doc: str, val_fraction: float) -> bool:
    """A streamed document's split: validation when its content hash is below `val_fraction` (as `validation_mask`
    decides for a table, without its at-least-one rule, which needs every document first)."""
    return hash_unit(doc.encode("utf-8")) < val_fraction


@dataclass
class Stream:
    """Documents read once, in order, never held whole (a `datasets` stream): each non-empty document goes to
    validation by `is_validation`, or, with `read_val`, validation is that stream's documents. The token cache stops
    reading at `max_tokens` tokens (end-of-document tokens included; with `read_val`, its share `val_fraction` of the
    budget is read from it)."""

    read: Callable[[], Iterator[list[str]]]
    val_fraction: float
    max_tokens: int | None = None
    read_val: Callable[[], Iterator[list[str]]] | None = None

    def split(self, want_val: bool) -> StreamDocs:
        return StreamDocs(self, want_val)


@dataclass
class StreamDocs:
    """One split of a `Stream`, read lazily for whoever asks for documents (`Docs`' interface without a budget:
    `count` and `nbytes` read the whole stream). The token cache reads a `Stream` itself, once, for both splits."""

    stream: Stream
    want_val: bool

    def batches(self, batch_bytes: int | None = None) -> Iterator[list[str]]:
        batch_bytes = batch_bytes or BATCH_BYTES
        s = self.stream
        read = s.read_val if (self.want_val and s.read_val is not None) else s.read
        by_hash = s.read_val is None
        out: list[str] = []
        size = 0
        for batch in read():
            for doc in batch:  # one step per document
                if not doc or (by_hash and is_validation(doc, s.val_fraction) != self.want_val):
                    continue
                out.append(doc)
                size += len(doc)
                if size >= batch_bytes:
                    yield out
                    out, size = [], 0
        if out:
            yield out

    @property
    def count(self) -> int:
        return sum(len(b) for b in self.batches())

    @property
    def nbytes(self) -> int:
        return sum(len(d.encode("utf-8")) for b in self.batches() for d in b)


@dataclass
class Source:
    """A source opened cheaply: fingerprint and summary now, documents only when tokenization needs them.

    `stream`: set by a source that reads its documents as a stream (`data=hf data.streaming=true`); the token cache
    then reads it once for both splits, up to its budget, and `documents` gives its splits lazily to other readers.
    """

    fingerprint: str
    info: dict[str, Any]
    documents: Callable[[], tuple[Docs, Docs, str]]
    stream: Stream | None = None


class DataSource:
    """One registered data source: `data.source=<name>` picks it, `config_cls` holds its own options.

    `tasks`: the registered evaluation tasks (`posenc_cli.evaluation.tasks`) a sweep job trained on this source runs,
    in order.
    """

    name: ClassVar[str]
    config_cls: ClassVar[type[DataConfig]]
    tasks: ClassVar[tuple[str, ...]] = ("extrapolate",)

    @classmethod
    def open(cls, data: Any, root: Path, progress: ProgressFn | None) -> Source:
        """Fingerprint and summary of the corpus `data` describes; `root` is the cache directory (for `datasets`)."""
        raise NotImplementedError

    @classmethod
    def describe(cls, data: Any) -> str:
        """Short human name of a data config, stored with each evaluation entry."""
        return str(data.source)
