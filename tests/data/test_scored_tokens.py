"""The scored mask of task data: `Marked` documents (`data/sources/base.py`), `Tokenizer.encode_scored`
(`data/tokenizer.py`), what each source marks, and the token cache's mask files (`data/cache.py`)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from posenc_cli.config import TokenizerConfig
from posenc_cli.data.cache import MANIFEST, load_corpus
from posenc_cli.data.sources.algorithmic import AlgorithmicDataConfig, split_sizes
from posenc_cli.data.sources.algorithmic import make_documents as algorithmic_documents
from posenc_cli.data.sources.base import Marked, prompt_answer
from posenc_cli.data.sources.passkey import make_episodes
from posenc_cli.data.sources.tasks import TasksDataConfig
from posenc_cli.data.sources.tasks import make_documents as task_documents
from posenc_cli.data.sources.text import TextDataConfig
from posenc_cli.data.tokenizer import ByteTokenizer, Tokenizer, train_bpe

BYTE = ByteTokenizer()


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("POSENC_CACHE_DIR", str(cache))
    return cache


def _byte_ids(texts: list[str]) -> np.ndarray:
    """Today's ids, computed from the UTF-8 bytes alone: each document's bytes, then 256."""
    return np.concatenate([np.array([*t.encode("utf-8"), 256], dtype=np.int64) for t in texts])


def _sources() -> dict[str, list[str]]:
    return {
        "algorithmic": algorithmic_documents(AlgorithmicDataConfig(examples=100), 40, 0),
        "passkey": make_episodes(20, min_len=0, max_len=200, digits=5, seed=0),
        "tasks": task_documents(TasksDataConfig(max_len=200, corpus_share=0.3), 30, 0, "plain corpus text. " * 40),
        "plain": ["plain text, é and 日本", "", "another document"],
    }


def test_marked_is_its_text() -> None:
    doc = prompt_answer("Copy: a b [SEP]", " a b")
    assert doc == "Copy: a b [SEP] a b" and isinstance(doc, str)
    assert doc.pieces == (("Copy: a b [SEP]", False), (" a b", True))
    assert type(doc[:4]) is str and "\n".join([doc, "x"]) == "Copy: a b [SEP] a b\nx"
    assert pickle.loads(pickle.dumps(doc)).pieces == doc.pieces
    told = prompt_answer("Q?", " A", kind="niah-single")
    assert told.kind == "niah-single" and doc.kind is None
    assert pickle.loads(pickle.dumps(told)).kind == "niah-single"


@pytest.mark.parametrize("source", ["algorithmic", "passkey", "tasks", "plain"])
def test_byte_ids_of_every_source_unchanged(source: str) -> None:
    docs = _sources()[source]
    ids, scored = BYTE.encode_scored(docs)
    assert np.array_equal(ids.astype(np.int64), _byte_ids(docs))
    assert np.array_equal(BYTE.encode_documents(docs), ids)
    assert scored.shape == ids.shape and scored.dtype == np.uint8


@pytest.mark.parametrize("source", ["algorithmic", "passkey", "tasks"])
def test_answers_and_their_end_are_scored(source: str) -> None:
    docs = _sources()[source]
    ids, scored = BYTE.encode_scored(docs)
    at = 0
    for doc in docs:  # one step per document
        n = len(doc.encode("utf-8"))
        want = np.ones(n + 1, dtype=np.uint8)  # plain corpus documents (data=tasks corpus_share) are all scored
        if isinstance(doc, Marked):
            prompt, answer = (text for text, _ in doc.pieces)
            want[: len(prompt.encode("utf-8"))] = 0
            assert BYTE.decode(ids[at : at + n + 1][want.astype(bool)]) == answer + "<|endoftext|>"
        assert np.array_equal(scored[at : at + n + 1], want)
        at += n + 1
    assert at == ids.size and 0 < scored.sum() < scored.size


def test_generic_rule_equals_the_byte_rule() -> None:
    """The prefix-encoding rule every tokenizer inherits gives the byte tokenizer's own fast answer."""
    docs = _sources()["tasks"] + _sources()["plain"]
    fast, generic = BYTE.encode_scored(docs), Tokenizer.encode_scored(BYTE, docs)
    assert np.array_equal(fast[0], generic[0]) and np.array_equal(fast[1], generic[1])


def test_bpe_ids_unchanged_and_answers_scored() -> None:
    docs = _sources()["algorithmic"]
    bpe = train_bpe([str(d) for d in algorithmic_documents(AlgorithmicDataConfig(examples=100), 400, 1)], 320)
    ids, scored = bpe.encode_scored(docs)
    assert np.array_equal(ids, bpe.encode_documents([str(d) for d in docs]))
    ends = np.flatnonzero(ids == bpe.eod_id)
    starts = np.concatenate([[0], ends[:-1] + 1])
    for doc, start, end in zip(docs, starts, ends, strict=True):
        mark = scored[start : end + 1].astype(bool)
        assert bpe.decode(ids[start : end + 1][mark]) == doc.pieces[1][0] + "<|endoftext|>"


def test_a_token_across_the_boundary_is_scored() -> None:
    """A tokenizer that merges the prompt's last byte with the answer's first: the merged token is scored."""

    class Pairs(ByteTokenizer):
        def encode(self, text: str) -> np.ndarray:  # "xy" is one token (300), everything else bytes
            out: list[int] = []
            for ch in text:
                out[-1:] = [300] if out and out[-1] == ord("x") and ch == "y" else [*out[-1:], ord(ch)]
            return np.array(out, dtype=np.int64)

        def encode_documents(self, texts):  # type: ignore[no-untyped-def]
            return np.concatenate([np.append(self.encode(t), self.eod_id) for t in texts])

    ids, scored = Tokenizer.encode_scored(Pairs(), [prompt_answer("abx", "yz")])
    assert ids.tolist() == [97, 98, 300, 122, 256] and scored.tolist() == [0, 0, 1, 1, 1]


def test_cache_stores_and_reloads_the_mask(_cache: Path) -> None:
    data = AlgorithmicDataConfig(examples=60, max_length=6)
    first = load_corpus(data, TokenizerConfig())
    assert first.train_scored is not None and first.val_scored is not None
    docs = algorithmic_documents(data, split_sizes(data)[0], 0)  # the training split
    ids, scored = BYTE.encode_scored(docs)
    assert np.array_equal(np.asarray(first.train), ids) and np.array_equal(np.asarray(first.train_scored), scored)
    again = load_corpus(data, TokenizerConfig())
    assert again.info["reused"] and isinstance(again.train_scored, np.memmap)
    assert np.array_equal(np.asarray(again.train_scored), scored)
    assert again.info["scored_tokens"]["train"] == int(scored.sum())


def test_plain_source_keeps_no_mask(_cache: Path, tmp_path: Path) -> None:
    for i in range(4):
        (tmp_path / f"doc{i}.txt").write_text(f"plain text number {i}\n" * 20)
    corpus = load_corpus(TextDataConfig(paths=[str(tmp_path / "*.txt")], val_fraction=0.25), TokenizerConfig())
    assert corpus.train_scored is None and corpus.val_scored is None
    entry = Path(corpus.info["cache_path"])
    assert not list(entry.glob("*.scored.bin"))
    assert corpus.info["scored_tokens"] == corpus.info["tokens"]


def test_a_cache_without_the_mask_layout_is_rebuilt(_cache: Path) -> None:
    """A manifest of the layout before the mask (no "layout") is not trusted: the entry is rebuilt with the mask."""
    data = AlgorithmicDataConfig(examples=60, max_length=6)
    entry = Path(load_corpus(data, TokenizerConfig()).info["cache_path"])
    manifest = json.loads((entry / MANIFEST).read_text())
    del manifest["layout"]
    (entry / MANIFEST).write_text(json.dumps(manifest))
    (entry / "train.scored.bin").unlink()
    again = load_corpus(data, TokenizerConfig())
    assert not again.info["reused"] and again.train_scored is not None


def test_the_cache_records_each_task_s_longest_prompt(_cache: Path) -> None:
    """A mixture's documents tell their task: the manifest keeps each task's longest training prompt (the inputs
    before the first answer token, [eod] included), what the competence gate bounds that task's 1× prompt by."""
    data = TasksDataConfig(tasks=["niah-single", "variable-tracking"], episodes=80, max_len=300)
    corpus = load_corpus(data, TokenizerConfig())
    docs = task_documents(data, corpus.info["documents"]["train"], 0)  # the training split, regenerated
    ids, _ = BYTE.encode_scored(docs)
    assert np.array_equal(np.asarray(corpus.train), ids)
    want: dict[str, int] = {}
    for doc in docs:  # bytes: the prompt's, and the opening end-of-document token
        want[doc.kind] = max(want.get(doc.kind, 0), len(doc.pieces[0][0].encode("utf-8")) + 1)
    assert corpus.info["longest_prompt_by_task"] == want and len(want) == 2
    assert want["niah-single"] != want["variable-tracking"]  # one bound per task, not the mixture's
    assert load_corpus(data, TokenizerConfig()).info["longest_prompt_by_task"] == want  # reused from the manifest
    plain = load_corpus(AlgorithmicDataConfig(examples=60, max_length=6), TokenizerConfig())
    assert "longest_prompt_by_task" not in plain.info  # documents that do not tell their task
