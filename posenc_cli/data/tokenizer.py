"""Tokenizers: raw UTF-8 bytes plus an end-of-document token, or byte-level BPE trained with HF `tokenizers`.

Both turn text into integer ids without a Python loop over tokens (bytes: `np.frombuffer`; BPE: the Rust
`encode_batch_fast`). `token_bytes[i]` is the number of UTF-8 bytes token `i` stands for (0 for end-of-document),
so bits-per-byte = sum(loss) / (ln 2 * sum(token_bytes[targets])) for any tokenizer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from posenc_cli.config import TokenizerConfig
from posenc_cli.errors import CheckpointError, DataError
from posenc_cli.fsutil import atomic_write_text

EOD_TOKEN = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"
BYTE_VOCAB_SIZE = 257  # 256 byte values + end-of-document


def token_dtype(vocab_size: int) -> np.dtype:
    """Storage dtype of token ids: uint16 when every id fits, else int32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class Tokenizer:
    """Common interface; `ByteTokenizer` and `BPETokenizer` implement it."""

    kind: str
    vocab_size: int
    eod_id: int
    token_bytes: np.ndarray  # (V,) int64: UTF-8 bytes per token id, 0 for end-of-document
    fingerprint: str

    @property
    def dtype(self) -> np.dtype:
        return token_dtype(self.vocab_size)

    def encode(self, text: str) -> np.ndarray:
        """Ids of `text` (no end-of-document added), int64 of shape (n,)."""
        raise NotImplementedError

    def encode_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Ids of every document each followed by `eod_id`, concatenated: shape (sum n_i + len(texts),)."""
        raise NotImplementedError

    def encode_scored(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """`encode_documents(texts)` and, per id, whether it is scored (uint8, same shape): every token of a plain
        `str`; of a document with `pieces` (`data.sources.base.Marked`), the tokens of its scored pieces, and each
        end-of-document token when its document's last piece is scored. The ids are exactly `encode_documents`'s.

        A piece's tokens are found by encoding the text up to each piece boundary: the tokens that text shares with
        the whole document's belong to the pieces before the boundary, so a token a tokenizer merges across the
        boundary belongs to the later piece (a prompt's last byte merged into the answer's first token is scored)."""
        ids = self.encode_documents(texts)
        scored = np.ones(ids.size, dtype=np.uint8)
        if not any(hasattr(t, "pieces") for t in texts):
            return ids, scored
        ends = np.flatnonzero(ids == self.eod_id)  # (D,): only the pipeline places end-of-document tokens
        starts = np.concatenate([[0], ends[:-1] + 1])  # (D,)
        for text, start, end in zip(texts, starts.tolist(), ends.tolist(), strict=True):  # one step per document
            pieces = getattr(text, "pieces", None)
            if pieces is not None:
                scored[start : end + 1] = _piece_marks(self, pieces, np.asarray(ids[start:end], dtype=np.int64))
        return ids, scored

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Text of `ids`; end-of-document renders as `<|endoftext|>`, broken UTF-8 as U+FFFD."""
        raise NotImplementedError

    def save(self, run_dir: Path) -> None:
        """Write what `load_tokenizer(cfg, run_dir)` needs into `run_dir` (nothing for bytes)."""

    def describe(self) -> str:
        return f"{self.kind} (vocab {self.vocab_size})"


def _piece_marks(tokenizer: Tokenizer, pieces: Sequence[tuple[str, bool]], whole: np.ndarray) -> np.ndarray:
    """Scored marks (uint8) of one document's `whole` ids and its end-of-document token (`Tokenizer.encode_scored`)."""
    marks = np.zeros(whole.size + 1, dtype=np.uint8)
    start, prefix = 0, ""
    for i, (text, scored) in enumerate(pieces):  # one step per piece
        prefix += text
        if i + 1 < len(pieces):
            head = tokenizer.encode(prefix)
            n = min(head.size, whole.size)
            same = head[:n] == whole[:n]
            end = n if same.all() else int(np.argmin(same))  # tokens shared with the whole document's
        else:
            end = whole.size + 1  # the last piece owns the end-of-document token
        marks[start:end] = scored
        start = max(start, end)
    return marks


class ByteTokenizer(Tokenizer):
    """Ids 0..255 are UTF-8 bytes, 256 is end-of-document."""

    kind = "byte"
    vocab_size = BYTE_VOCAB_SIZE
    eod_id = 256

    def __init__(self) -> None:
        self.token_bytes = np.ones(BYTE_VOCAB_SIZE, dtype=np.int64)
        self.token_bytes[self.eod_id] = 0
        self.fingerprint = _short_hash("posenc-byte-tokenizer-v1")

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def encode_documents(self, texts: Sequence[str]) -> np.ndarray:
        raw = [t.encode("utf-8") for t in texts]
        lengths = np.fromiter((len(r) for r in raw), dtype=np.int64, count=len(raw))  # (D,)
        ends = np.cumsum(lengths + 1) - 1  # (D,) position of each document's end-of-document token
        out = np.empty(int(lengths.sum()) + len(raw), dtype=self.dtype)
        is_byte = np.ones(out.size, dtype=bool)
        is_byte[ends] = False
        out[is_byte] = np.frombuffer(b"".join(raw), dtype=np.uint8)
        out[ends] = self.eod_id
        return out

    def encode_scored(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """As `Tokenizer.encode_scored`, from the pieces' byte lengths (a byte is a token)."""
        ids = self.encode_documents(texts)
        if not any(hasattr(t, "pieces") for t in texts):
            return ids, np.ones(ids.size, dtype=np.uint8)
        marks: list[np.ndarray] = []
        for text in texts:  # one step per document
            pieces = getattr(text, "pieces", None) or [(text, True)]
            for piece, scored in pieces:
                marks.append(np.full(len(piece.encode("utf-8")), scored, dtype=np.uint8))
            marks.append(np.array([pieces[-1][1]], dtype=np.uint8))  # the end-of-document token
        return ids, np.concatenate(marks)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64).ravel()
        if arr.size and (arr.min() < 0 or arr.max() > self.eod_id):
            raise ValueError(f"byte token ids must be in [0, {self.eod_id}]")
        pieces = np.split(arr, np.flatnonzero(arr == self.eod_id))  # each piece after the first starts with eod
        texts = [pieces[0].astype(np.uint8).tobytes().decode("utf-8", errors="replace")]
        texts += [p[1:].astype(np.uint8).tobytes().decode("utf-8", errors="replace") for p in pieces[1:]]
        return EOD_TOKEN.join(texts)


class BPETokenizer(Tokenizer):
    """Byte-level BPE (GPT-2 style pre-tokenisation) from HF `tokenizers`, with `<|endoftext|>` as its only special.

    Text that happens to contain the string `<|endoftext|>` is encoded as ordinary bytes, so only the pipeline can
    place an end-of-document token.
    """

    kind = "bpe"

    def __init__(self, hf_tokenizer: object, source: str = "tokenizer") -> None:
        # deferred: keeps tokenizers off posenc --help start-up
        from tokenizers import Tokenizer as HFTokenizer

        if not isinstance(hf_tokenizer, HFTokenizer):
            raise TypeError("BPETokenizer wraps a tokenizers.Tokenizer")
        self._hf = hf_tokenizer
        self._hf.encode_special_tokens = True  # literal "<|endoftext|>" in text is just text
        eod = self._hf.token_to_id(EOD_TOKEN)
        if eod is None:
            raise CheckpointError(f"{source}: the BPE tokenizer has no {EOD_TOKEN} token")
        self.eod_id = int(eod)
        self.vocab_size = int(self._hf.get_vocab_size(with_added_tokens=True))
        self.token_bytes = self._count_token_bytes(source)
        self.fingerprint = _short_hash(self._hf.to_str())

    def _count_token_bytes(self, source: str) -> np.ndarray:
        """In byte-level BPE every character of a token string stands for exactly one byte (GPT-2's byte map)."""
        # deferred: keeps tokenizers off posenc --help start-up
        from tokenizers import pre_tokenizers

        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        special = set(self._hf.get_added_tokens_decoder())
        out = np.zeros(self.vocab_size, dtype=np.int64)
        for token, idx in self._hf.get_vocab(with_added_tokens=True).items():  # a loop over the vocabulary, once
            if idx in special:
                continue
            if not set(token) <= alphabet:
                raise CheckpointError(f"{source}: token {token!r} is not byte-level BPE")
            out[idx] = len(token)
        return out

    @classmethod
    def from_file(cls, path: Path) -> BPETokenizer:
        # deferred: keeps tokenizers off posenc --help start-up
        from tokenizers import Tokenizer as HFTokenizer

        try:
            hf = HFTokenizer.from_file(str(path))
        except Exception as e:  # the Rust loader raises plain Exception on bad JSON
            raise CheckpointError(f"{path}: not a readable tokenizer file ({str(e).splitlines()[0]})") from e
        return cls(hf, source=str(path))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._hf.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def encode_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.empty(0, dtype=self.dtype)
        encodings = self._hf.encode_batch_fast(list(texts), add_special_tokens=False)  # parallel, in Rust
        eod = np.array([self.eod_id], dtype=self.dtype)
        parts: list[np.ndarray] = []
        for enc in encodings:  # one step per document, not per token
            parts.append(np.asarray(enc.ids, dtype=self.dtype))
            parts.append(eod)
        return np.concatenate(parts)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64).ravel()
        return self._hf.decode(arr.tolist(), skip_special_tokens=False)

    def to_json(self) -> str:
        return self._hf.to_str()

    def save(self, run_dir: Path) -> None:
        atomic_write_text(Path(run_dir) / TOKENIZER_FILE, self._hf.to_str())


def train_bpe(texts: Iterable[str], vocab_size: int) -> BPETokenizer:
    """Train byte-level BPE with at most `vocab_size` ids (256 bytes + `<|endoftext|>` + merges).

    The vocabulary is smaller when the text offers fewer merges with a count of at least 2.
    """
    # deferred: keeps tokenizers off posenc --help start-up
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(hf, source="trained tokenizer")


# The end-of-document token of a pretrained tokenizer, when its tokenizer_config.json names no `eos_token`: the first
# of these in its vocabulary (GPT-2 and SmolLM: <|endoftext|>; Llama 3: <|end_of_text|>; Llama 2, Mistral: </s>).
EOD_CANDIDATES = (EOD_TOKEN, "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>")
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


class PretrainedTokenizer(Tokenizer):
    """A pretrained `tokenizers`/`transformers` tokenizer (`tokenizer=hf tokenizer.path=DIR`: DIR/tokenizer.json).

    No special token is added around a document (`add_special_tokens=False`) and special-token strings inside the text
    are encoded as text, so only the pipeline places the end-of-document token (its `eos_token`). `token_bytes` comes
    from the vocabulary (byte-level BPE: one byte per character of a token); the token cache checks, batch by batch,
    that the tokens' bytes add up to the text's, so bits per byte stay exact or the corpus is refused
    (`check_token_bytes`).
    """

    kind = "hf"

    def __init__(self, tokenizer_json: str, eod_token: str | None, source: str) -> None:
        # deferred: keeps tokenizers off posenc --help start-up
        from tokenizers import Tokenizer as HFTokenizer

        try:
            hf = HFTokenizer.from_str(tokenizer_json)
        except Exception as e:  # the Rust loader raises plain Exception on bad JSON
            raise DataError(f"{source}: not a readable tokenizer.json ({first_line(e)})") from e
        self._hf = hf
        self._hf.encode_special_tokens = True  # literal special-token strings in text are just text
        vocab = hf.get_vocab(with_added_tokens=True)
        names = [eod_token] if eod_token else [t for t in EOD_CANDIDATES if t in vocab]
        if not names or names[0] not in vocab:
            wanted = eod_token or " or ".join(EOD_CANDIDATES)
            raise DataError(
                f"{source}: the tokenizer has no end-of-document token {wanted} (tokenizer_config.json's eos_token)"
            )
        self.eod_token = names[0]
        self.eod_id = int(vocab[self.eod_token])
        self.vocab_size = max(vocab.values()) + 1
        self.token_bytes = byte_level_counts(hf, self.vocab_size)
        self.token_bytes[self.eod_id] = 0
        self._json = tokenizer_json
        self.fingerprint = _short_hash(f"{tokenizer_json}|eod={self.eod_token}")

    @classmethod
    def from_dir(cls, path: Path) -> PretrainedTokenizer:
        """The tokenizer of folder `path`: tokenizer.json, and the `eos_token` of tokenizer_config.json if present."""
        file = Path(path).expanduser() / TOKENIZER_FILE
        if not file.is_file():
            raise DataError(f"{path}: no {TOKENIZER_FILE} (tokenizer=hf takes a tokenizers/transformers folder)")
        try:
            text = file.read_bytes().decode("utf-8")  # bytes as stored: tokenizer.sha256 is their hash
        except UnicodeDecodeError as e:
            raise DataError(f"{file}: not UTF-8 JSON") from e
        return cls(text, eos_token_of(Path(path).expanduser()), str(file))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._hf.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def encode_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.empty(0, dtype=self.dtype)
        encodings = self._hf.encode_batch_fast(list(texts), add_special_tokens=False)  # parallel, in Rust
        eod = np.array([self.eod_id], dtype=self.dtype)
        parts: list[np.ndarray] = []
        for enc in encodings:  # one step per document, not per token
            parts += [np.asarray(enc.ids, dtype=self.dtype), eod]
        return np.concatenate(parts)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64).ravel()
        return self._hf.decode(arr.tolist(), skip_special_tokens=False)

    def to_json(self) -> str:
        return self._json

    def save(self, run_dir: Path) -> None:
        """tokenizer.json as given, and a tokenizer_config.json naming the end-of-document token."""
        atomic_write_text(Path(run_dir) / TOKENIZER_FILE, self._json)
        atomic_write_text(Path(run_dir) / TOKENIZER_CONFIG_FILE, json.dumps({"eos_token": self.eod_token}) + "\n")

    def describe(self) -> str:
        return f"hf (vocab {self.vocab_size}, end of document {self.eod_token})"


def pretrained_vocab_size(path: str | None) -> int | None:
    """The vocabulary of the pretrained tokenizer in folder `path` (largest id + 1), None when it cannot be read."""
    if not path:
        return None
    try:
        return PretrainedTokenizer.from_dir(Path(path)).vocab_size
    except DataError:
        return None


def eos_token_of(folder: Path) -> str | None:
    """The `eos_token` tokenizer_config.json names (a string, or a dict with `content`), None without one."""
    path = folder / TOKENIZER_CONFIG_FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not readable JSON ({first_line(e)})") from e
    eos = raw.get("eos_token") if isinstance(raw, dict) else None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) and eos else None


def byte_level_counts(hf: object, size: int) -> np.ndarray:
    """(size,) int64 UTF-8 bytes per id: a byte-level token's character count (GPT-2's byte map), otherwise its
    UTF-8 length with SentencePiece's '▁' as a space; 0 for special tokens. Exact for byte-level BPE; the token cache
    refuses a tokenizer whose counts do not add up to the text (`check_token_bytes`)."""
    # deferred: keeps tokenizers off posenc --help start-up
    from tokenizers import pre_tokenizers

    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    special = {i for i, t in hf.get_added_tokens_decoder().items() if t.special}  # type: ignore[attr-defined]
    out = np.zeros(size, dtype=np.int64)
    for token, idx in hf.get_vocab(with_added_tokens=True).items():  # type: ignore[attr-defined]  # once per id
        if idx in special:
            continue
        out[idx] = len(token) if set(token) <= alphabet else len(token.replace("\u2581", " ").encode("utf-8"))
    return out


def check_token_bytes(tokenizer: Tokenizer, texts: Sequence[str], ids: np.ndarray) -> int:
    """The UTF-8 bytes of `texts` (what bits per byte divides by); DataError when the bytes its tokens `ids` stand
    for add up to another number (a tokenizer that adds a prefix space or normalises text), since evaluation counts
    a window's bytes from its tokens."""
    n_text = sum(len(t.encode("utf-8")) for t in texts)
    n_tokens = int(tokenizer.token_bytes[ids].sum())
    if n_text != n_tokens:
        raise DataError(
            f"tokenizer {tokenizer.describe()}: its tokens stand for {n_tokens:,} bytes of text that has {n_text:,} "
            "(a prefix space or normalisation), so bits per byte would be wrong; use a byte-level BPE tokenizer "
            "(GPT-2, Llama 3, SmolLM, Qwen)"
        )
    return n_text


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_tokenizer(cfg: TokenizerConfig, run_dir: Path | None = None) -> Tokenizer:
    """The byte tokenizer, a run's BPE or pretrained tokenizer from `run_dir/tokenizer.json`, or (no run directory,
    `tokenizer=hf`) the pretrained tokenizer of `tokenizer.path`, checked against `tokenizer.sha256`.

    A BPE tokenizer is trained from a corpus by `data.load_corpus`; without a run directory there is none to load.
    """
    if cfg.kind == "byte":
        return ByteTokenizer()
    if cfg.kind == "hf":
        folder = Path(run_dir) if run_dir is not None else Path(cfg.path or ".").expanduser()
        tokenizer = PretrainedTokenizer.from_dir(folder)
        digest = hashlib.sha256(tokenizer.to_json().encode("utf-8")).hexdigest()
        if run_dir is None and cfg.sha256 is not None and digest != cfg.sha256:
            raise DataError(
                f"{folder / TOKENIZER_FILE}: sha256 {digest[:16]} differs from tokenizer.sha256={cfg.sha256[:16]} "
                "(the file changed since the config was made)"
            )
        return tokenizer
    if run_dir is None:
        raise DataError("tokenizer=bpe is trained from the corpus: prepare it with load_corpus or give a run directory")
    path = Path(run_dir) / TOKENIZER_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (a run trained with tokenizer=bpe keeps its tokenizer there)")
    return BPETokenizer.from_file(path)
