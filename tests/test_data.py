"""Data pipeline: the three sources, train/validation split, token cache (reuse, atomicity), batching."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

import posenc_cli.data as data_mod
from posenc_cli.config import DataConfig, TokenizerConfig
from posenc_cli.data import (
    EOD_TOKEN,
    Corpus,
    cache_root,
    eval_windows,
    expand_paths,
    load_corpus,
    sample_batch,
    split_document,
    stdlib_files,
    validation_mask,
)
from posenc_cli.errors import DataError

BYTE = TokenizerConfig(kind="byte", vocab_size=257)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("POSENC_CACHE_DIR", str(cache))
    return cache


def docs_of(corpus: Corpus, split: str) -> list[str]:
    """Documents of a split, recovered by decoding and cutting at end-of-document."""
    tokens = getattr(corpus, split)
    text = corpus.tokenizer.decode(np.asarray(tokens))
    assert text == "" or text.endswith(EOD_TOKEN)
    return text.split(EOD_TOKEN)[:-1]


def write_files(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@pytest.fixture
def fake_stdlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    files = {f"pkg{i % 7}/mod_{i:03d}.py": f"# pkg{i % 7}/mod_{i:03d}.py\nx = {i}  # é\n" for i in range(120)}
    files |= {
        "abc.py": "# abc.py\nimport os\n",
        "pkg0/__init__.py": "",
        "site-packages/third.py": "# third party\n",
        "lib/dist-packages/other.py": "# other\n",
        "__pycache__/cached.py": "# cached\n",
        "README.txt": "not python\n",
    }
    root = write_files(tmp_path / "stdlib", files)
    monkeypatch.setattr(data_mod, "stdlib_root", lambda: root)
    return root


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
    corpus = load_corpus(DataConfig(source="stdlib", val_fraction=0.2), BYTE)
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
    cfg = DataConfig(source="stdlib", val_fraction=0.2)
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


@pytest.fixture
def text_dir(tmp_path: Path) -> Path:
    files = {f"doc_{i:02d}.txt": f"document {i}: ünïcode ✓\nsecond line {i}\n" for i in range(30)}
    files |= {"sub/nested.txt": "nested document\n", "sub/.hidden.txt": "hidden\n", "notes.md": "markdown doc\n"}
    return write_files(tmp_path / "corpus", files)


def test_expand_paths(text_dir: Path) -> None:
    everything = expand_paths([str(text_dir)])
    assert len(everything) == 32 and not any(".hidden" in str(p) for p in everything)
    assert len(expand_paths([str(text_dir / "*.txt")])) == 30
    assert len(expand_paths([str(text_dir / "**" / "*.txt")])) == 31
    assert expand_paths([str(text_dir / "notes.md"), str(text_dir / "notes.md")]) == [text_dir / "notes.md"]
    with pytest.raises(DataError, match=r"missing\.txt.*nothing/\*\.txt"):
        expand_paths([str(text_dir / "missing.txt"), str(text_dir), str(text_dir / "nothing" / "*.txt")])


def test_text_source_documents_and_split(text_dir: Path) -> None:
    corpus = load_corpus(DataConfig(source="text", paths=[str(text_dir)], val_fraction=0.2), BYTE)
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
    cfg = DataConfig(source="text", paths=[str(text_dir / "*.txt")], val_paths=[str(held)])
    corpus = load_corpus(cfg, BYTE)
    assert docs_of(corpus, "val") == [held.read_text()]
    assert held.read_text() not in docs_of(corpus, "train")  # listed in both: validation wins
    assert len(docs_of(corpus, "train")) == 29
    assert corpus.info["split_method"] == "data.val_paths"


def test_text_source_single_file_holds_out_tail(tmp_path: Path) -> None:
    book = tmp_path / "book.txt"
    book.write_text("".join(f"sentence number {i} of the book.\n" for i in range(500)))
    corpus = load_corpus(DataConfig(source="text", paths=[str(book)], val_fraction=0.05), BYTE)
    train, val = docs_of(corpus, "train"), docs_of(corpus, "val")
    assert len(train) == len(val) == 1
    assert train[0] + val[0] == book.read_text()
    assert val[0].startswith("sentence number")


def test_text_missing_paths_named(tmp_path: Path) -> None:
    cfg = DataConfig(source="text", paths=[str(tmp_path / "a.txt"), str(tmp_path / "b" / "*.txt")])
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
    return calls


def test_hf_split_by_document(fake_hub: list[tuple]) -> None:
    cfg = DataConfig(source="hf", name="someone/corpus", config="v1", val_fraction=0.25)
    corpus = load_corpus(cfg, BYTE)
    assert fake_hub == [("someone/corpus", "v1", "train")]
    train, val = docs_of(corpus, "train"), docs_of(corpus, "val")
    assert not set(train) & set(val)
    assert set(train) | set(val) == set(HF_ROWS[:60]) | {"   "}  # the empty row is no document
    assert corpus.info["name"] == "someone/corpus" and corpus.info["rows"] == 62


def test_hf_val_split(fake_hub: list[tuple]) -> None:
    cfg = DataConfig(source="hf", name="someone/corpus", val_split="validation")
    corpus = load_corpus(cfg, BYTE)
    assert docs_of(corpus, "val") == ["held out A\n", "held out B\n"]
    assert len(docs_of(corpus, "train")) == 61  # every non-empty row; "   " is a (whitespace) document
    assert corpus.info["split_method"] == "data.val_split"


def test_hf_bad_column_and_split(fake_hub: list[tuple]) -> None:
    with pytest.raises(DataError, match=r"text_column='body'.*columns: text, label"):
        load_corpus(DataConfig(source="hf", name="someone/corpus", text_column="body"), BYTE)
    with pytest.raises(DataError, match="holds"):
        load_corpus(DataConfig(source="hf", name="someone/corpus", text_column="label"), BYTE)
    with pytest.raises(DataError, match="Unknown split"):
        load_corpus(DataConfig(source="hf", name="someone/corpus", split="bogus"), BYTE)


def test_hf_unreachable_message(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach 'wikitext' on the Hub (ConnectError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    with pytest.raises(DataError) as err:
        load_corpus(DataConfig(source="hf", name="wikitext", config="wikitext-2-raw-v1"), BYTE)
    message = str(err.value)
    assert "\n" not in message
    assert "could not be fetched" in message and "data=text data.paths=" in message and "Couldn't reach" in message


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
        load_corpus(DataConfig(source="hf", name="posenc-tests/no-such-dataset"), BYTE)
    assert "data=text data.paths=" in str(err.value)
    assert attempts == []
    assert before == datasets.config.HF_HUB_OFFLINE  # the library setting is restored afterwards


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
    cfg = DataConfig(source="stdlib", val_fraction=0.2)
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
    cfg = DataConfig(source="text", paths=[str(text_dir)], val_fraction=0.2)
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
    cfg = DataConfig(source="stdlib", val_fraction=0.2)
    monkeypatch.setattr(data_mod, "BATCH_BYTES", 200)  # many small batches
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
    cfg = DataConfig(source="stdlib", val_fraction=0.2)

    def killed(*args: object) -> None:
        raise SystemExit(137)

    monkeypatch.setattr(data_mod, "atomic_write_json", killed)
    with pytest.raises(SystemExit):
        load_corpus(cfg, BYTE)
    assert _entry_files(_cache) == ["train.bin", "val.bin"]  # arrays, but no manifest: untrusted
    monkeypatch.undo()
    monkeypatch.setattr(data_mod, "stdlib_root", lambda: fake_stdlib)
    monkeypatch.setenv("POSENC_CACHE_DIR", str(_cache))
    corpus = load_corpus(cfg, BYTE)
    assert corpus.info["reused"] is False
    assert _entry_files(_cache) == ["manifest.json", "train.bin", "val.bin"]


def test_truncated_array_is_not_trusted(fake_stdlib: Path, _cache: Path) -> None:
    cfg = DataConfig(source="stdlib", val_fraction=0.2)
    first = load_corpus(cfg, BYTE)
    n = first.info["tokens"]["train"]
    train_file = Path(first.info["cache_path"]) / "train.bin"
    del first
    with open(train_file, "r+b") as f:
        f.truncate(n)  # half of the uint16 bytes
    again = load_corpus(cfg, BYTE)
    assert again.info["reused"] is False and len(again.train) == n


def test_hard_kill_mid_write_leaves_no_trusted_file(fake_stdlib: Path, tmp_path: Path, _cache: Path) -> None:
    """A process killed with os._exit while writing (no cleanup runs) leaves only a temp file that is ignored."""
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        import posenc_cli.data as d
        from posenc_cli.config import DataConfig, TokenizerConfig
        d.stdlib_root = lambda: Path({str(fake_stdlib)!r})
        d.BATCH_BYTES = 200
        real, n = d.tokenize, [0]
        def tokenize(tok, docs):
            n[0] += 1
            if n[0] == 3:
                os._exit(9)
            return real(tok, docs)
        d.tokenize = tokenize
        d.load_corpus(DataConfig(source="stdlib", val_fraction=0.2), TokenizerConfig(kind="byte"))
        """
    )
    env = {**os.environ, "POSENC_CACHE_DIR": str(_cache)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    left = _entry_files(_cache)
    assert left and all(name.endswith(".tmp") for name in left)  # a partial temp file, never a .bin
    corpus = load_corpus(DataConfig(source="stdlib", val_fraction=0.2), BYTE)
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
    corpus = load_corpus(DataConfig(source="stdlib", val_fraction=0.2), BYTE)
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
