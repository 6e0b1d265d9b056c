"""Tokenizers: round trips, byte accounting against GPT-2's byte map, save/load, end-of-document handling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.convert_slow_tokenizer import bytes_to_unicode  # test-only oracle for byte-level BPE

from posenc_cli.config import TokenizerConfig
from posenc_cli.data.tokenizer import (
    EOD_TOKEN,
    TOKENIZER_FILE,
    BPETokenizer,
    ByteTokenizer,
    load_tokenizer,
    token_dtype,
    train_bpe,
)
from posenc_cli.errors import CheckpointError, DataError

SAMPLES = [
    "hello world",
    "héllo wörld, ça va? naïve café",
    "日本語のテキスト and 中文 mixed with ASCII",
    "emoji 🌍🚀 and combining e\u0301",
    "def f(x):\n    return x ** 2  # comment\n\ttab\r\n",
    "",
]

CORPUS = [
    "def add(a, b):\n    return a + b\n" * 20,
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n" * 15,
    "Der schnelle braune Fuchs springt über den faulen Hund. Ça coûte 5 €.\n" * 10,
    "東京は日本の首都です。大阪も大きな都市です。\n" * 10,
]


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return train_bpe(iter(CORPUS), vocab_size=400)


def test_byte_vocab_and_eod() -> None:
    tok = ByteTokenizer()
    assert (tok.vocab_size, tok.eod_id) == (257, 256)
    assert tok.token_bytes.shape == (257,) and tok.token_bytes[256] == 0
    assert (tok.token_bytes[:256] == 1).all()
    assert tok.dtype == np.uint16


@pytest.mark.parametrize("text", SAMPLES)
def test_byte_round_trip(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids.dtype == np.int64
    assert ids.tolist() == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert int(tok.token_bytes[ids].sum()) == len(text.encode("utf-8"))


def test_byte_documents_are_joined_with_eod() -> None:
    tok = ByteTokenizer()
    docs = ["ab", "é", "", "xyz"]
    ids = tok.encode_documents(docs)
    expected = []
    for d in docs:
        expected += [*d.encode("utf-8"), 256]
    assert ids.tolist() == expected
    assert ids.dtype == np.uint16
    assert tok.decode(ids) == EOD_TOKEN.join([*docs, ""])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=6))
def test_byte_documents_property(docs: list[str]) -> None:
    tok = ByteTokenizer()
    ids = tok.encode_documents(docs)
    assert int((ids == tok.eod_id).sum()) == len(docs)
    assert int(tok.token_bytes[ids].sum()) == sum(len(d.encode("utf-8")) for d in docs)
    assert tok.decode(ids) == "".join(d + EOD_TOKEN for d in docs)


def test_byte_decode_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        ByteTokenizer().decode([300])


@pytest.mark.parametrize("text", SAMPLES)
def test_bpe_round_trip(bpe: BPETokenizer, text: str) -> None:
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text
    assert ids.max(initial=0) < bpe.vocab_size


def test_bpe_learns_merges(bpe: BPETokenizer) -> None:
    text = CORPUS[0]
    assert 257 < bpe.vocab_size <= 400
    assert len(bpe.encode(text)) < len(text.encode("utf-8")) / 2


def test_bpe_token_bytes_match_gpt2_byte_map(bpe: BPETokenizer) -> None:
    """Independent oracle: GPT-2's byte<->unicode table maps each token string back to its bytes."""
    byte_of = {ch: b for b, ch in bytes_to_unicode().items()}
    vocab = bpe._hf.get_vocab(with_added_tokens=True)
    for token, idx in vocab.items():
        expected = 0 if token == EOD_TOKEN else len(bytes(byte_of[c] for c in token))
        assert bpe.token_bytes[idx] == expected, token
    for text in SAMPLES:
        ids = bpe.encode(text)
        pieces = b"".join(bytes(byte_of[c] for c in bpe._hf.id_to_token(int(i))) for i in ids)
        assert pieces == text.encode("utf-8")
        assert int(bpe.token_bytes[ids].sum()) == len(text.encode("utf-8"))


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=60))
def test_bpe_round_trip_property(bpe: BPETokenizer, text: str) -> None:
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text
    assert int(bpe.token_bytes[ids].sum()) == len(text.encode("utf-8"))


def test_bpe_eod_only_from_pipeline(bpe: BPETokenizer) -> None:
    text = f"a{EOD_TOKEN}b"
    assert bpe.eod_id not in bpe.encode(text).tolist()
    ids = bpe.encode_documents(["x", text])
    assert (ids == bpe.eod_id).sum() == 2
    assert ids[-1] == bpe.eod_id
    assert ids.dtype == np.uint16


def test_bpe_save_and_load(bpe: BPETokenizer, tmp_path: Path) -> None:
    bpe.save(tmp_path)
    assert (tmp_path / TOKENIZER_FILE).is_file()
    loaded = load_tokenizer(TokenizerConfig(kind="bpe", vocab_size=400), tmp_path)
    assert isinstance(loaded, BPETokenizer)
    assert loaded.fingerprint == bpe.fingerprint
    assert (loaded.token_bytes == bpe.token_bytes).all()
    for text in SAMPLES:
        assert loaded.encode(text).tolist() == bpe.encode(text).tolist()


def test_byte_save_writes_nothing(tmp_path: Path) -> None:
    ByteTokenizer().save(tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert isinstance(load_tokenizer(TokenizerConfig(kind="byte"), tmp_path), ByteTokenizer)


def test_load_bpe_errors(tmp_path: Path) -> None:
    cfg = TokenizerConfig(kind="bpe", vocab_size=400)
    with pytest.raises(CheckpointError, match=TOKENIZER_FILE):
        load_tokenizer(cfg, tmp_path)
    (tmp_path / TOKENIZER_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match=TOKENIZER_FILE):
        load_tokenizer(cfg, tmp_path)
    with pytest.raises(DataError):
        load_tokenizer(cfg, None)


def test_token_dtype() -> None:
    assert token_dtype(257) == np.uint16
    assert token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.int32
