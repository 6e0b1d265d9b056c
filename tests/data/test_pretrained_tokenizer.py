"""`tokenizer=hf tokenizer.path=DIR`: a pretrained `tokenizers` folder (built and saved here), its hash in the config
and so in a sweep cell's key, a run trained with it, and bits per byte exact against a hand count."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from train_utils import tiny_overrides

from posenc_cli import api
from posenc_cli.config import Config, TokenizerConfig
from posenc_cli.data.cache import load_corpus
from posenc_cli.data.sources.text import TextDataConfig
from posenc_cli.data.tokenizer import PretrainedTokenizer, load_tokenizer
from posenc_cli.errors import ConfigError, DataError
from posenc_cli.run.load import load_run
from posenc_cli.run.memory import planned_vocab_size
from posenc_cli.sweep.identity import identity_hash, job_identity

TEXT = "".join(f"The cat number {i} sat on mat {i % 7}; naïve café ünïcode — ok. " for i in range(300))


def byte_level_bpe(folder: Path, special: str = "<|endoftext|>", vocab_size: int = 320) -> Path:
    """A GPT-2-style byte-level BPE trained on TEXT and saved as a tokenizers folder."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT], trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def hf_config(folder: Path) -> TokenizerConfig:
    cfg = TokenizerConfig(kind="hf", path=str(folder))
    cfg.validate()
    return cfg


def test_a_saved_tokenizer_loads_with_its_hash_and_exact_byte_counts(tmp_path: Path) -> None:
    folder = byte_level_bpe(tmp_path / "tok")
    cfg = hf_config(folder)
    assert cfg.sha256 is not None and len(cfg.sha256) == 64
    tok = load_tokenizer(cfg)
    assert isinstance(tok, PretrainedTokenizer) and tok.kind == "hf" and tok.eod_token == "<|endoftext|>"
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT and ids.size < len(TEXT.encode("utf-8")) // 2  # merges
    assert int(tok.token_bytes[ids].sum()) == len(TEXT.encode("utf-8"))
    text_with_special = "a <|endoftext|> b"  # a special token's string inside the text is text
    assert tok.eod_id not in tok.encode(text_with_special).tolist()
    # saved into a run directory and loaded back: the same tokenizer
    tok.save(tmp_path / "run")
    again = load_tokenizer(cfg, tmp_path / "run")
    assert again.fingerprint == tok.fingerprint and again.eod_id == tok.eod_id
    assert planned_vocab_size(Config(tokenizer=cfg)) == tok.vocab_size != cfg.vocab_size  # the memory check's


def test_the_end_of_document_token_comes_from_tokenizer_config(tmp_path: Path) -> None:
    folder = byte_level_bpe(tmp_path / "tok", special="</s>")
    assert load_tokenizer(hf_config(folder)).eod_token == "</s>"  # a known end-of-text name
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<none>"}}))
    with pytest.raises(DataError, match="no end-of-document token <none>"):
        load_tokenizer(hf_config(folder))


def test_a_changed_file_and_a_missing_folder_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no tokenizer.json"):
        hf_config(tmp_path / "absent")
    with pytest.raises(ConfigError, match="needs tokenizer.path"):
        TokenizerConfig(kind="hf").validate()
    folder = byte_level_bpe(tmp_path / "tok")
    cfg = hf_config(folder)
    byte_level_bpe(folder, vocab_size=300)  # replaced after the config was made
    with pytest.raises(DataError, match="differs from tokenizer.sha256"):
        load_tokenizer(cfg)


def test_the_tokenizer_hash_is_in_a_cell_key(tmp_path: Path) -> None:
    one, other = byte_level_bpe(tmp_path / "a"), byte_level_bpe(tmp_path / "b", vocab_size=300)
    keys = [identity_hash(job_identity(Config(tokenizer=hf_config(f)))) for f in (one, other)]
    assert keys[0] != keys[1]
    assert job_identity(Config(tokenizer=hf_config(one)))["tokenizer.sha256"] == hf_config(one).sha256


def test_a_tokenizer_whose_tokens_miscount_the_text_is_refused(tmp_path: Path) -> None:
    """SentencePiece-style: the '▁' it prepends to a document stands for a byte the text lacks."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "</s>"]))
    (tmp_path / "sp").mkdir()
    tok.save(str(tmp_path / "sp" / "tokenizer.json"))
    (tmp_path / "corpus.txt").write_text("hello there\n" * 50)
    data = TextDataConfig(paths=[str(tmp_path / "corpus.txt")], cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataError, match="bits per byte would be wrong") as err:
        load_corpus(data, hf_config(tmp_path / "sp"))
    assert "\n" not in str(err.value)


def test_a_run_trained_with_it_evaluates_with_exact_bits_per_byte(tmp_path: Path) -> None:
    folder = byte_level_bpe(tmp_path / "tok")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    overrides = [*tiny_overrides(corpus, steps=4), "tokenizer=hf", f"tokenizer.path={folder}"]
    result = api.train(overrides, out=tmp_path / "run")
    assert result.stopped_reason == "complete"
    run = load_run(tmp_path / "run")
    assert run.tokenizer.kind == "hf" and run.config.tokenizer.sha256 == hf_config(folder).sha256
    assert (tmp_path / "run" / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()

    evaluation = api.evaluate([tmp_path / "run"], lengths=[1], tokens=64, device="cpu", threads=1)
    (entry,) = evaluation.results[0]["entries"]
    assert entry["status"] == "ok"
    # by hand: the scored targets are the validation split's tokens 1..n (non-overlapping windows from its start);
    # their bytes are the UTF-8 bytes of the text they decode to, end-of-document tokens none
    val = np.asarray(load_corpus(run.config.data, run.config.tokenizer, tokenizer=run.tokenizer).val)
    scored = val[1 : entry["tokens"] + 1]
    pieces = np.split(scored, np.flatnonzero(scored == run.tokenizer.eod_id))
    texts = [run.tokenizer.decode(p[p != run.tokenizer.eod_id]) for p in pieces]
    assert not any("\ufffd" in t for t in texts)  # the span starts and ends on character boundaries
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    assert n_bytes > 2 * entry["tokens"]  # merged tokens: many more bytes than tokens
    assert entry["bpb"] == pytest.approx(entry["nll"] * entry["tokens"] / (math.log(2) * n_bytes), rel=1e-7)
