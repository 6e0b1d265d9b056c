"""Corpus sources: stdlib, text files and HF datasets (loader replaced, no network); the train/validation split."""

from __future__ import annotations

import platform
import socket
from pathlib import Path

import datasets
import numpy as np
import pytest
from corpus_utils import BYTE, docs_of

from posenc_cli.data.cache import load_corpus
from posenc_cli.data.sources import hf as hf_source
from posenc_cli.data.sources.base import split_document, validation_mask
from posenc_cli.data.sources.hf import HfDataConfig
from posenc_cli.data.sources.stdlib import StdlibDataConfig, stdlib_files
from posenc_cli.data.sources.text import TextDataConfig, expand_paths
from posenc_cli.errors import ConfigError, DataError


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("POSENC_CACHE_DIR", str(cache))
    return cache


# ----------------------------------------------------------------------------------------------------------------
# data=stdlib


def test_stdlib_files_skip_packages_and_sort(fake_stdlib: Path) -> None:
    rels = stdlib_files(fake_stdlib)
    assert rels == sorted(rels)
    assert "abc.py" in rels and "pkg0/__init__.py" in rels
    assert not any("site-packages" in r or "dist-packages" in r or "__pycache__" in r for r in rels)
    assert all(r.endswith(".py") for r in rels)
    assert len(rels) == 122


def test_stdlib_source_split_and_info(fake_stdlib: Path) -> None:
    corpus = load_corpus(StdlibDataConfig(val_fraction=0.2), BYTE)
    info = corpus.info
    assert info["source"] == "stdlib" and info["files"] == 122
    assert info["python_version"] == platform.python_version()
    assert info["documents"]["train"] + info["documents"]["val"] == 121  # the empty __init__.py is no document
    assert 5 <= info["documents"]["val"] <= 45  # ~20% of 121 (binomial, > 3 sd either side)
    train, val = docs_of(corpus, "train"), docs_of(corpus, "val")
    assert not set(train) & set(val)
    names = [d.splitlines()[0][2:] for d in train]
    assert names == sorted(names)  # sorted relative-path order
    every = {(fake_stdlib / r).read_text() for r in stdlib_files(fake_stdlib)}
    assert set(train) | set(val) == every - {""}
    assert info["bytes"]["train"] == sum(len(d.encode()) for d in train)
    assert info["tokens"]["val"] == info["bytes"]["val"] + info["documents"]["val"]


def test_stdlib_split_follows_path_not_content(fake_stdlib: Path) -> None:
    cfg = StdlibDataConfig(val_fraction=0.2)
    first = load_corpus(cfg, BYTE)
    val_names = {d.splitlines()[0] for d in docs_of(first, "val")}
    for r in stdlib_files(fake_stdlib):
        path = fake_stdlib / r
        if path.read_text():
            path.write_text(path.read_text() + "y = 2\n")
    second = load_corpus(cfg, BYTE)
    assert second.info["fingerprint"] != first.info["fingerprint"]
    assert not second.info["reused"]
    assert {d.splitlines()[0] for d in docs_of(second, "val")} == val_names


# ----------------------------------------------------------------------------------------------------------------
# Split helpers


def test_validation_mask_keeps_both_splits() -> None:
    scores = np.array([0.5, 0.6, 0.7])
    sizes = np.array([1, 1, 1])
    val = validation_mask(scores, sizes, 0.02)
    assert val.tolist() == [True, False, False]  # none below 0.02: the lowest score moves to validation
    val = validation_mask(scores, sizes, 1.0)
    assert val.tolist() == [True, True, False]  # all below 1.0: the highest stays in training
    assert not validation_mask(scores, sizes, 0.0).any()
    assert validation_mask(np.array([0.0, 0.9]), np.array([0, 5]), 0.5).tolist() == [False, False]


def test_split_document_cuts_at_line() -> None:
    text = "".join(f"line {i}\n" for i in range(100))
    head, tail = split_document(text, 0.1)
    assert head + tail == text
    assert tail.startswith("line ") and head.endswith("\n")
    assert 0.05 < len(tail) / len(text) < 0.15
    with pytest.raises(DataError):
        split_document("x", 0.5)


# ----------------------------------------------------------------------------------------------------------------
# data=text


def test_expand_paths(text_dir: Path) -> None:
    everything = expand_paths([str(text_dir)])
    assert len(everything) == 32 and not any(".hidden" in str(p) for p in everything)
    assert len(expand_paths([str(text_dir / "*.txt")])) == 30
    assert len(expand_paths([str(text_dir / "**" / "*.txt")])) == 31
    assert expand_paths([str(text_dir / "notes.md"), str(text_dir / "notes.md")]) == [text_dir / "notes.md"]
    with pytest.raises(DataError, match=r"missing\.txt.*nothing/\*\.txt"):
        expand_paths([str(text_dir / "missing.txt"), str(text_dir), str(text_dir / "nothing" / "*.txt")])


def test_text_source_documents_and_split(text_dir: Path) -> None:
    corpus = load_corpus(TextDataConfig(paths=[str(text_dir)], val_fraction=0.2), BYTE)
    train, val = docs_of(corpus, "train"), docs_of(corpus, "val")
    expected = {p.read_text() for p in expand_paths([str(text_dir)])}
    assert len(train) + len(val) == 32  # one document per file
    assert set(train) | set(val) == expected
    assert not set(train) & set(val)
    assert val and corpus.info["split_method"] == "document hash"
    assert corpus.info["files"] == 32
    assert isinstance(corpus.train, np.memmap) and corpus.train.dtype == np.uint16


def test_text_source_explicit_val_paths(text_dir: Path) -> None:
    held = text_dir / "doc_03.txt"
    cfg = TextDataConfig(paths=[str(text_dir / "*.txt")], val_paths=[str(held)])
    corpus = load_corpus(cfg, BYTE)
    assert docs_of(corpus, "val") == [held.read_text()]
    assert held.read_text() not in docs_of(corpus, "train")  # listed in both: validation wins
    assert len(docs_of(corpus, "train")) == 29
    assert corpus.info["split_method"] == "data.val_paths"


def test_text_source_single_file_holds_out_tail(tmp_path: Path) -> None:
    book = tmp_path / "book.txt"
    book.write_text("".join(f"sentence number {i} of the book.\n" for i in range(500)))
    corpus = load_corpus(TextDataConfig(paths=[str(book)], val_fraction=0.05), BYTE)
    train, val = docs_of(corpus, "train"), docs_of(corpus, "val")
    assert len(train) == len(val) == 1
    assert train[0] + val[0] == book.read_text()
    assert val[0].startswith("sentence number")


def test_text_evaluation_only_corpus_is_the_whole_files(tmp_path: Path) -> None:
    """Held-out files alone (no data.paths): every file is validation, whole; nothing is training."""
    book = tmp_path / "held_out.txt"
    book.write_text("".join(f"sentence number {i} of the book.\n" for i in range(500)))
    cfg = TextDataConfig(val_paths=[str(book)])
    cfg.validate()
    corpus = load_corpus(cfg, BYTE)
    assert docs_of(corpus, "val") == [book.read_text()] and len(corpus.train) == 0
    assert corpus.info["split_method"] == "whole files"
    split = load_corpus(TextDataConfig(paths=[str(book)]), BYTE)  # the same file as a training corpus: its 2% tail
    assert len(split.val) < len(corpus.val) // 10
    assert split.info["fingerprint"] != corpus.info["fingerprint"]
    with pytest.raises(ConfigError, match="data.paths"):
        TextDataConfig().validate()


def test_text_missing_paths_named(tmp_path: Path) -> None:
    cfg = TextDataConfig(paths=[str(tmp_path / "a.txt"), str(tmp_path / "b" / "*.txt")])
    with pytest.raises(DataError, match=r"a\.txt.*b/\*\.txt"):
        load_corpus(cfg, BYTE)


# ----------------------------------------------------------------------------------------------------------------
# data=hf (the loader is replaced; the network is never used)


HF_ROWS = [f"row {i} — text number {i}\n" for i in range(60)] + ["", "   "]


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    calls: list[tuple] = []

    def load_dataset(name: str, config: str | None = None, *, split: str | None = None, **kw: object):
        calls.append((name, config, split))
        if split == "validation":
            return datasets.Dataset.from_dict({"text": ["held out A\n", "held out B\n"], "label": [0, 1]})
        if split == "bogus":
            raise ValueError("Unknown split \"bogus\". Should be one of ['train', 'validation'].")
        return datasets.Dataset.from_dict({"text": HF_ROWS, "label": list(range(len(HF_ROWS)))})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(hf_source, "hub_reachable", lambda timeout=3.0: True)  # no network in tests
    return calls


def test_hf_split_by_document(fake_hub: list[tuple]) -> None:
    cfg = HfDataConfig(name="someone/corpus", config="v1", val_fraction=0.25)
    corpus = load_corpus(cfg, BYTE)
    assert fake_hub == [("someone/corpus", "v1", "train")]
    train, val = docs_of(corpus, "train"), docs_of(corpus, "val")
    assert not set(train) & set(val)
    assert set(train) | set(val) == set(HF_ROWS[:60]) | {"   "}  # the empty row is no document
    assert corpus.info["name"] == "someone/corpus" and corpus.info["rows"] == 62


def test_hf_val_split(fake_hub: list[tuple]) -> None:
    cfg = HfDataConfig(name="someone/corpus", val_split="validation")
    corpus = load_corpus(cfg, BYTE)
    assert docs_of(corpus, "val") == ["held out A\n", "held out B\n"]
    assert len(docs_of(corpus, "train")) == 61  # every non-empty row; "   " is a (whitespace) document
    assert corpus.info["split_method"] == "data.val_split"


def test_hf_bad_column_and_split(fake_hub: list[tuple]) -> None:
    with pytest.raises(DataError, match=r"text_column='body'.*columns: text, label"):
        load_corpus(HfDataConfig(name="someone/corpus", text_column="body"), BYTE)
    with pytest.raises(DataError, match="holds"):
        load_corpus(HfDataConfig(name="someone/corpus", text_column="label"), BYTE)
    with pytest.raises(DataError, match="Unknown split"):
        load_corpus(HfDataConfig(name="someone/corpus", split="bogus"), BYTE)


def test_hf_unreachable_message(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach 'wikitext' on the Hub (ConnectError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    monkeypatch.setattr(hf_source, "hub_reachable", lambda timeout=3.0: True)  # reachable, then the fetch fails
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    with pytest.raises(DataError) as err:
        load_corpus(HfDataConfig(name="wikitext", config="wikitext-2-raw-v1"), BYTE)
    message = str(err.value)
    assert "\n" not in message
    assert "could not be fetched" in message and "data.data_files=" in message and "Couldn't reach" in message


def test_hf_offline_env_is_honoured_without_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_DATASETS_OFFLINE set after `datasets` was imported still keeps it off the network."""
    attempts: list[object] = []

    def no_network(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    before = datasets.config.HF_HUB_OFFLINE
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    with pytest.raises(DataError, match="offline mode is on") as err:
        load_corpus(HfDataConfig(name="posenc-tests/no-such-dataset"), BYTE)
    assert "data.data_files=" in str(err.value) and "load_dataset(" in str(err.value)
    assert attempts == []
    assert before == datasets.config.HF_HUB_OFFLINE  # the library setting is restored afterwards


def test_hf_without_network_fails_fast_from_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """No network: one connection attempt, then `datasets` runs in offline mode (no ~26 s of retries)."""
    attempts: list[object] = []
    offline_during_load: list[bool] = []

    def no_network(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise OSError("Network is unreachable")

    def load_dataset(*args: object, **kwargs: object) -> None:
        offline_during_load.append(bool(datasets.config.HF_HUB_OFFLINE))
        raise ConnectionError("Couldn't reach 'wikitext' on the Hub (offline mode is enabled)")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    with pytest.raises(DataError, match="Hub is unreachable .no network.. and it is not in the local cache"):
        load_corpus(HfDataConfig(name="wikitext", config="wikitext-2-raw-v1"), BYTE)
    assert len(attempts) == 1 and offline_during_load == [True]  # was: online, retrying with back-off
    assert datasets.config.HF_HUB_OFFLINE is False  # restored
