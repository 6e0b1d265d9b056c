"""Token cache (reuse, atomicity, cached BPE) and batching; the sources themselves are tested in test_sources.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from corpus_utils import BYTE, docs_of, sample_batch

import posenc_cli.data.cache as data_mod
import posenc_cli.data.sources.base as sources_base
import posenc_cli.data.sources.stdlib as stdlib_source
from posenc_cli.config import DataConfig, TokenizerConfig
from posenc_cli.data.cache import cache_root, eval_windows, load_corpus
from posenc_cli.data.sources.stdlib import StdlibDataConfig
from posenc_cli.data.sources.text import TextDataConfig, expand_paths
from posenc_cli.errors import DataError


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("POSENC_CACHE_DIR", str(cache))
    return cache


# ----------------------------------------------------------------------------------------------------------------
# Token cache


def test_cache_root_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cache_root(DataConfig(cache_dir=str(tmp_path / "x"))) == tmp_path / "x"
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "env"))
    assert cache_root(DataConfig()) == tmp_path / "env"
    monkeypatch.delenv("POSENC_CACHE_DIR")
    monkeypatch.chdir(tmp_path)
    assert cache_root(DataConfig()) == tmp_path / "outputs" / ".cache"


def test_second_run_does_no_tokenization(fake_stdlib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = StdlibDataConfig(val_fraction=0.2)
    first = load_corpus(cfg, BYTE)
    assert first.info["reused"] is False

    def fail(*args: object) -> None:
        raise AssertionError("tokenized again")

    monkeypatch.setattr(data_mod, "tokenize", fail)
    second = load_corpus(cfg, BYTE)
    assert second.info["reused"] is True
    assert np.array_equal(second.train, first.train) and np.array_equal(second.val, first.val)
    assert second.info["tokens"] == first.info["tokens"]


def test_bpe_corpus_is_cached(text_dir: Path, monkeypatch: pytest.MonkeyPatch, _cache: Path) -> None:
    cfg = TextDataConfig(paths=[str(text_dir)], val_fraction=0.2)
    bpe = TokenizerConfig(kind="bpe", vocab_size=300)
    first = load_corpus(cfg, bpe)
    assert first.tokenizer.kind == "bpe"
    assert len(list((_cache / "tokenizers").glob("bpe-*-300.json"))) == 1
    assert set(docs_of(first, "train")) | set(docs_of(first, "val")) == {
        p.read_text() for p in expand_paths([str(text_dir)])
    }
    assert first.info["bytes"]["train"] == sum(len(d.encode()) for d in docs_of(first, "train"))

    def fail(*args: object) -> None:
        raise AssertionError("work repeated")

    monkeypatch.setattr(data_mod, "train_bpe", fail)
    monkeypatch.setattr(data_mod, "tokenize", fail)
    second = load_corpus(cfg, bpe)
    assert second.info["reused"] and second.tokenizer.fingerprint == first.tokenizer.fingerprint
    assert np.array_equal(second.train, first.train)
    # a run's own tokenizer can be passed in: same fingerprint -> same cache entry
    third = load_corpus(cfg, bpe, tokenizer=first.tokenizer)
    assert third.info["cache_path"] == first.info["cache_path"]


def _entry_files(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "tokens").rglob("*") if p.is_file())


def test_crash_while_tokenizing_leaves_nothing_trusted(
    fake_stdlib: Path, monkeypatch: pytest.MonkeyPatch, _cache: Path
) -> None:
    cfg = StdlibDataConfig(val_fraction=0.2)
    monkeypatch.setattr(sources_base, "BATCH_BYTES", 200)  # many small batches
    real = data_mod.tokenize
    calls = {"n": 0}

    def crash_after_two(tokenizer: object, docs: list[str]) -> np.ndarray:
        calls["n"] += 1
        if calls["n"] > 2:
            raise KeyboardInterrupt
        return real(tokenizer, docs)

    monkeypatch.setattr(data_mod, "tokenize", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        load_corpus(cfg, BYTE)
    assert _entry_files(_cache) == []  # no half array, no manifest
    monkeypatch.setattr(data_mod, "tokenize", real)
    corpus = load_corpus(cfg, BYTE)
    assert corpus.info["reused"] is False
    assert len(docs_of(corpus, "train")) == corpus.info["documents"]["train"] > 0


def test_crash_before_manifest_is_rebuilt(fake_stdlib: Path, monkeypatch: pytest.MonkeyPatch, _cache: Path) -> None:
    cfg = StdlibDataConfig(val_fraction=0.2)

    def killed(*args: object) -> None:
        raise SystemExit(137)

    monkeypatch.setattr(data_mod, "atomic_write_json", killed)
    with pytest.raises(SystemExit):
        load_corpus(cfg, BYTE)
    assert _entry_files(_cache) == ["train.bin", "val.bin"]  # arrays, but no manifest: untrusted
    monkeypatch.undo()
    monkeypatch.setattr(stdlib_source, "stdlib_root", lambda: fake_stdlib)
    monkeypatch.setenv("POSENC_CACHE_DIR", str(_cache))
    corpus = load_corpus(cfg, BYTE)
    assert corpus.info["reused"] is False
    assert _entry_files(_cache) == ["manifest.json", "train.bin", "val.bin"]


def test_truncated_array_is_not_trusted(fake_stdlib: Path, _cache: Path) -> None:
    cfg = StdlibDataConfig(val_fraction=0.2)
    first = load_corpus(cfg, BYTE)
    n = first.info["tokens"]["train"]
    train_file = Path(first.info["cache_path"]) / "train.bin"
    del first
    with open(train_file, "r+b") as f:
        f.truncate(n)  # half of the uint16 bytes
    again = load_corpus(cfg, BYTE)
    assert again.info["reused"] is False and len(again.train) == n


@pytest.mark.integration  # a subprocess killed
def test_hard_kill_mid_write_leaves_no_trusted_file(fake_stdlib: Path, tmp_path: Path, _cache: Path) -> None:
    """A process killed with os._exit while writing (no cleanup runs) leaves only a temp file that is ignored."""
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        import posenc_cli.data.cache as d
        import posenc_cli.data.sources.base as s
        import posenc_cli.data.sources.stdlib as stdlib_source
        from posenc_cli.config import TokenizerConfig
        from posenc_cli.data.sources.stdlib import StdlibDataConfig
        stdlib_source.stdlib_root = lambda: Path({str(fake_stdlib)!r})
        s.BATCH_BYTES = 200
        real, n = d.tokenize, [0]
        def tokenize(tok, docs):
            n[0] += 1
            if n[0] == 3:
                os._exit(9)
            return real(tok, docs)
        d.tokenize = tokenize
        d.load_corpus(StdlibDataConfig(val_fraction=0.2), TokenizerConfig(kind="byte"))
        """
    )
    env = {**os.environ, "POSENC_CACHE_DIR": str(_cache)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    left = _entry_files(_cache)
    assert left and all(name.endswith(".tmp") for name in left)  # a partial temp file, never a .bin
    corpus = load_corpus(StdlibDataConfig(val_fraction=0.2), BYTE)
    assert corpus.info["reused"] is False
    assert len(docs_of(corpus, "train")) == corpus.info["documents"]["train"]


# ----------------------------------------------------------------------------------------------------------------
# Batching


def test_sample_batch_windows() -> None:
    tokens = np.arange(5000).astype(np.uint16)
    x, y = sample_batch(tokens, 8, 32, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y, x + 1)  # windows of consecutive tokens
    assert torch.equal(x, x[:, :1] + torch.arange(32))
    assert int(y.max()) < 5000


def test_sample_batch_determinism() -> None:
    tokens = np.arange(10_000).astype(np.uint16)
    a = sample_batch(tokens, 4, 16, torch.Generator().manual_seed(7))
    b = sample_batch(tokens, 4, 16, torch.Generator().manual_seed(7))
    c = sample_batch(tokens, 4, 16, torch.Generator().manual_seed(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    g = torch.Generator().manual_seed(7)
    first, second = sample_batch(tokens, 4, 16, g), sample_batch(tokens, 4, 16, g)
    assert torch.equal(first[0], a[0]) and not torch.equal(second[0], first[0])


def test_sample_batch_covers_every_start() -> None:
    tokens = np.arange(20).astype(np.uint16)
    x, _ = sample_batch(tokens, 2000, 16, torch.Generator().manual_seed(0))
    assert set(x[:, 0].tolist()) == {0, 1, 2, 3}  # the last window ends on the last token
    with pytest.raises(DataError, match="fewer than seq_len"):
        sample_batch(tokens, 2, 20, torch.Generator())


def test_sample_batch_on_memmap(fake_stdlib: Path) -> None:
    corpus = load_corpus(StdlibDataConfig(val_fraction=0.2), BYTE)
    x, y = sample_batch(corpus.train, 4, 8, torch.Generator().manual_seed(1))
    assert x.shape == (4, 8) and torch.equal(y[:, :-1], x[:, 1:])
    train = np.asarray(corpus.train).astype(np.int64)
    for row_x, row_y in zip(x.numpy(), y.numpy(), strict=True):
        window = np.concatenate([row_x, row_y[-1:]])  # the seq_len + 1 tokens drawn
        starts = np.flatnonzero(train[: len(train) - 8] == window[0])
        assert any(np.array_equal(train[s : s + 9], window) for s in starts)


def test_eval_windows() -> None:
    tokens = np.arange(100).astype(np.uint16)
    w = eval_windows(tokens, 10, 10, None)
    assert w.shape == (9, 11) and w.dtype == torch.int64
    assert w[:, 0].tolist() == [10 * k for k in range(9)]
    assert torch.equal(w, w[:, :1] + torch.arange(11))
    assert eval_windows(tokens, 10, 5, None).shape == (18, 11)
    assert eval_windows(tokens, 10, 5, 4).shape == (4, 11)
    assert eval_windows(tokens, 99, 1, None).shape == (1, 100)
    with pytest.raises(DataError):
        eval_windows(tokens, 100, 1, None)
