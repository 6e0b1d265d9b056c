"""`data=hf` from local sources (files, a save_to_disk folder) and as a stream with a token budget: the budget stops
the reading, the same budget and seed give the same token cache, and what is missing offline is named in one line."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from posenc_cli.config import TokenizerConfig
from posenc_cli.data.cache import _build_stream_entry, load_corpus
from posenc_cli.data.sources import open_source
from posenc_cli.data.sources.base import Stream, is_validation
from posenc_cli.data.sources.hf import HfDataConfig
from posenc_cli.data.tokenizer import ByteTokenizer
from posenc_cli.errors import ConfigError, DataError

BYTE = TokenizerConfig(kind="byte")
ROWS = [f"document {i}: " + "lorem ipsum " * (1 + i % 7) + "\n" for i in range(400)]


def docs_of(tokens: np.ndarray) -> list[str]:
    text = ByteTokenizer().decode(np.asarray(tokens))
    return [d for d in text.split("<|endoftext|>") if d]


@pytest.fixture
def parquet(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": ROWS, "id": list(range(len(ROWS)))}), path, row_group_size=50)
    return path


def streamed(tmp_path: Path, files: list[str], **kw: object) -> HfDataConfig:
    cfg = HfDataConfig(data_files=files, streaming=True, cache_dir=str(tmp_path / "cache"), val_fraction=0.2, **kw)
    cfg.validate()
    return cfg


def test_a_stream_stops_at_the_token_budget(tmp_path: Path, parquet: Path) -> None:
    corpus = load_corpus(streamed(tmp_path, [str(parquet)], max_tokens=3000), BYTE)
    tokens = corpus.info["tokens"]
    assert tokens["train"] + tokens["val"] == 3000
    assert tokens["val"] > 0 and tokens["train"] > tokens["val"]
    assert corpus.info["split_method"] == "document hash (streamed)"
    # every whole document went where its content hash sends it, and they are the corpus's first rows, in order
    train, val = docs_of(corpus.train), docs_of(corpus.val)
    assert all(not is_validation(d, 0.2) for d in train[:-1]) and all(is_validation(d, 0.2) for d in val[:-1])
    assert train[:-1] == [r for r in ROWS if not is_validation(r, 0.2)][: len(train) - 1]
    # bytes from the text: the byte tokenizer's tokens are its bytes, end-of-document tokens count none
    assert corpus.info["bytes"]["train"] == tokens["train"] - int((np.asarray(corpus.train) == 256).sum())


def test_without_a_budget_the_stream_reads_the_whole_corpus(tmp_path: Path, parquet: Path) -> None:
    corpus = load_corpus(streamed(tmp_path, [str(parquet)]), BYTE)
    assert sorted(docs_of(corpus.train) + docs_of(corpus.val)) == sorted(ROWS)


def test_the_same_budget_and_seed_give_the_same_token_cache(tmp_path: Path, parquet: Path) -> None:
    def build(where: str, **kw: object) -> dict:
        cfg = streamed(tmp_path / where, [str(parquet)], **{"max_tokens": 2000, "shuffle_buffer": 64, **kw})
        return load_corpus(cfg, BYTE).info

    first, again = build("a", shuffle_seed=1), build("b", shuffle_seed=1)  # two caches, each built anew
    assert not first["reused"] and not again["reused"]
    assert first["fingerprint"] == again["fingerprint"]
    assert first["content_sha256"] == again["content_sha256"]
    other_seed, other_budget = build("c", shuffle_seed=2), build("d", shuffle_seed=1, max_tokens=2500)
    assert other_seed["fingerprint"] != first["fingerprint"] and other_seed["content_sha256"] != first["content_sha256"]
    assert other_budget["fingerprint"] != first["fingerprint"]
    assert build("a", shuffle_seed=1)["reused"]  # the same settings reuse the cache


def test_the_budget_stops_the_reading(tmp_path: Path) -> None:
    """Batches past the budget are never read: memory does not grow with the corpus."""
    pulled: list[int] = []

    def read() -> Iterator[list[str]]:
        for i in range(10_000):  # about 4 GB of text if read through
            pulled.append(i)
            yield ["x" * 400_000]

    stream = Stream(read=read, val_fraction=0.0, max_tokens=1_000_000)
    manifest = _build_stream_entry(tmp_path / "entry", "key", stream, ByteTokenizer(), None)
    assert manifest["splits"]["train"]["tokens"] == 1_000_000
    assert len(pulled) < 20


def test_a_save_to_disk_folder_is_read(tmp_path: Path) -> None:
    folder = tmp_path / "saved"
    splits = {"train": ROWS[:300], "validation": ROWS[300:]}
    datasets.DatasetDict({k: datasets.Dataset.from_dict({"text": v}) for k, v in splits.items()}).save_to_disk(folder)
    for streaming in (False, True):
        cfg = HfDataConfig(name=str(folder), val_split="validation", streaming=streaming, cache_dir=str(tmp_path / "c"))
        corpus = load_corpus(cfg, BYTE)
        assert docs_of(corpus.val) == ROWS[300:] and docs_of(corpus.train) == ROWS[:300]
    with pytest.raises(DataError, match=r"no split 'test' \(splits: train, validation\)"):
        load_corpus(HfDataConfig(name=str(folder), split="test", cache_dir=str(tmp_path / "c")), BYTE)


def test_jsonl_and_text_files(tmp_path: Path) -> None:
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps({"body": r}) + "\n" for r in ROWS[:50]))
    cfg = HfDataConfig(data_files=[str(jsonl)], text_column="body", cache_dir=str(tmp_path / "c"), val_fraction=0.2)
    for streaming in (False, True):
        corpus = load_corpus(HfDataConfig(**{**cfg.__dict__, "streaming": streaming}), BYTE)
        assert sorted(docs_of(corpus.train) + docs_of(corpus.val)) == sorted(ROWS[:50])
    text = tmp_path / "book.txt"
    text.write_text("first paragraph\nstill first\n\nsecond paragraph\n\nthird one\n")
    corpus = load_corpus(HfDataConfig(data_files=[str(text)], streaming=True, val_fraction=0.0), BYTE)
    assert len(docs_of(corpus.train)) == 3  # a text file's documents are its paragraphs


def test_a_binary_file_named_as_text_is_refused(tmp_path: Path, parquet: Path) -> None:
    disguised = tmp_path / "corpus.txt"
    disguised.write_bytes(parquet.read_bytes())
    with pytest.raises(DataError, match="corpus.txt holds a NUL byte") as err:
        load_corpus(HfDataConfig(data_files=[str(disguised)], cache_dir=str(tmp_path / "c")), BYTE)
    assert "\n" not in str(err.value)


def test_a_missing_dataset_offline_is_one_line_naming_what_and_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: (_ for _ in ()).throw(OSError("no network")))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    cfg = HfDataConfig(name="posenc-tests/absent", config="v1", streaming=True, max_tokens=100)
    with pytest.raises(DataError) as err:
        load_corpus(cfg, BYTE)
    message = str(err.value)
    assert "\n" not in message
    assert "load_dataset('posenc-tests/absent', 'v1', split='train')" in message
    assert str(tmp_path / "hf-cache") in message and "offline mode is on" in message


def test_unknown_format_and_bad_settings(tmp_path: Path) -> None:
    odd = tmp_path / "rows.xyz"
    odd.write_text("hello\n")
    with pytest.raises(DataError, match=r"cannot tell one format.*data\.name=arrow\|csv\|json\|parquet\|text"):
        load_corpus(HfDataConfig(data_files=[str(odd)]), BYTE)
    for bad, match in [
        ({"name": "x", "max_tokens": 10}, "add data.streaming=true"),
        ({"name": "x", "streaming": True, "max_tokens": 0}, "max_tokens must be >= 1"),
        ({"data_files": ["a.parquet"], "name": "someone/corpus"}, "must then be empty or one of"),
        ({}, "data.name=.*or data.data_files="),
    ]:
        with pytest.raises(ConfigError, match=match):
            HfDataConfig(**bad).validate()


def test_stream_splits_are_readable_without_the_cache(tmp_path: Path, parquet: Path) -> None:
    """Readers other than the token cache (a corpus haystack) get a stream's splits lazily."""
    source = open_source(streamed(tmp_path, [str(parquet)], max_tokens=500), tmp_path / "cache", None)
    _, val, method = source.documents()
    first = next(iter(val.batches()))
    assert first and all(is_validation(d, 0.2) for d in first) and method == "document hash (streamed)"


def test_bpe_is_trained_on_the_head_of_a_stream(tmp_path: Path, parquet: Path) -> None:
    corpus = load_corpus(
        streamed(tmp_path, [str(parquet)], max_tokens=3000), TokenizerConfig(kind="bpe", vocab_size=300)
    )
    assert corpus.tokenizer.kind == "bpe" and sum(corpus.info["tokens"].values()) == 3000
