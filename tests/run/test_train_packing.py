"""train.loss_on and train.packing in training (`run/train.py`) and validation (`run/validation.py`): the loss over
the scored targets of the global batch, padding that changes no real token's logit, exact resume, the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from train_utils import TRAIN_DEFAULTS, metrics, same_weights, weights
from typer.testing import CliRunner

import posenc_cli.run.train as train_mod
from posenc_cli.cli import app
from posenc_cli.config import Config, ModelConfig, TrainConfig
from posenc_cli.data.rows import Rows, example_rows, find_examples, packed_rows
from posenc_cli.data.sources.base import prompt_answer
from posenc_cli.data.tokenizer import ByteTokenizer
from posenc_cli.errors import ConfigError
from posenc_cli.model import build_model
from posenc_cli.positional import config_class, registry
from posenc_cli.run.config_load import config_from_dict
from posenc_cli.run.meta import read_meta
from posenc_cli.run.train import train
from posenc_cli.run.validation import ValidationSet, evaluate_scored, validation_set

BYTE = ByteTokenizer()
ALGORITHMIC = {"source": "algorithmic", "tasks": ["copy", "reverse"], "examples": 300, "max_length": 4}


def _config(data: dict, **train: object) -> Config:
    raw = {
        "model": {"d_model": 32, "n_layer": 2, "n_head": 2},
        "pos": {"name": "rope"},
        "data": data,
        "train": {**TRAIN_DEFAULTS, "seq_len": 24, **train},
    }
    return config_from_dict(raw)


def _independent_answer_nll(model: torch.nn.Module, rows: list[tuple[list[int], list[int]]]) -> float:
    """Mean NLL of the answer tokens alone: each row's tokens through the model, log-softmax at the positions
    before each answer token, averaged over all answer tokens of all rows."""
    nll: list[float] = []
    with torch.no_grad():
        for tokens, answer_at in rows:
            logp = torch.log_softmax(model(torch.tensor([tokens[:-1]]))[0].double(), dim=-1)  # (T, V)
            nll += [-float(logp[i - 1, tokens[i]]) for i in answer_at]
    return sum(nll) / len(nll)


def test_answer_loss_is_the_mean_nll_of_the_answer_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two micro-batches with 4 and 7 answer tokens: the step's loss is the mean over all 11, not the mean of the
    two micro-batches' means."""
    cfg = _config(ALGORITHMIC, steps=1, grad_accum=2, batch_size=1, seq_len=8, loss_on="answer", eval_every=1)
    short = [256, *b"ab:xyz", 256, 256]  # answer "xyz" and its end: targets at 4..7; one pad
    long = [256, *b"q", *b"abcdefg"]  # prompt "q", answer "abcdefg" (no end in the row)
    built = [
        (short, [False, False, False, True, True, True, True, False]),
        (long, [False, True, True, True, True, True, True, True]),  # targets q a b c d e f g
    ]
    real = [7, 8]  # inputs that are not padding: [eod] + "ab:xyz", then the whole second row
    batches = iter(
        Rows(torch.tensor([t]), torch.tensor([w]), None, None, n) for (t, w), n in zip(built, real, strict=True)
    )
    monkeypatch.setattr(train_mod._Trainer, "_rows", lambda self: next(batches))
    result = train(cfg, tmp_path / "run")
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg, BYTE.vocab_size)  # the run's initial weights: the first step's loss is theirs
    want = _independent_answer_nll(model, [(t, [i + 1 for i, w in enumerate(m) if w]) for t, m in built])
    assert result.train_loss == pytest.approx(want, abs=1e-5)
    assert metrics(tmp_path / "run", ("tokens", "scored_tokens")) == [(7 + 8, 4 + 7)]  # real inputs, answer targets
    means = [_independent_answer_nll(model, [(t, [i + 1 for i, w in enumerate(m) if w])]) for t, m in built]
    assert abs(sum(means) / 2 - want) > 1e-4  # the mean of means would differ


def test_validation_counts_the_scored_targets_only() -> None:
    docs = [prompt_answer("abc", " de"), prompt_answer("f", " ghij"), "plain"]
    ids, scored = BYTE.encode_scored(docs)
    vset = validation_set(ids, scored, 3, 8, 1, packing="none", answer_only=True, eod_id=BYTE.eod_id)
    assert vset.weights is not None
    cfg = _config(ALGORITHMIC)
    torch.manual_seed(0)
    model = build_model(cfg, BYTE.vocab_size)
    total, count = evaluate_scored(model, vset, torch.device("cpu"), "fp32")
    rows = vset.windows[0]
    answer_at = [[i + 1 for i, w in enumerate(vset.weights[0, r].tolist()) if w] for r in range(3)]
    assert count == 4 + 6 + 6  # " de" + end, " ghij" + end, every target of the plain document
    want = _independent_answer_nll(model, [(rows[r].tolist(), answer_at[r]) for r in range(3)])
    assert total / count == pytest.approx(want, abs=1e-5)
    whole = evaluate_scored(
        model, ValidationSet(vset.windows, torch.ones_like(vset.weights)), torch.device("cpu"), "fp32"
    )
    assert whole[1] == 3 * 8 and abs(whole[0] / whole[1] - want) > 1e-3


@pytest.mark.parametrize("scheme", sorted(registry()))
def test_padding_changes_no_logit_of_a_real_token(scheme: str) -> None:
    """`packing=none` rows: a short example padded to the row's length gives the logits it gives alone."""
    docs = [prompt_answer("copy: ab", " ab"), prompt_answer("x", " y")]
    ids, scored = BYTE.encode_scored(docs)
    ex = find_examples(ids.astype(np.int64), BYTE.eod_id)
    rows = example_rows(ids, scored, ex, np.array([0, 1]), 16, BYTE.eod_id, answer_only=True)
    model_cfg = ModelConfig(d_model=32, n_layer=6, n_head=2)  # 6: the longest layer pattern (gemma3)
    cfg = Config(model=model_cfg, pos=config_class(scheme)(name=scheme), train=TrainConfig(seq_len=16))
    torch.manual_seed(0)
    model = build_model(cfg, BYTE.vocab_size).eval()
    with torch.no_grad():
        padded = model(rows.tokens[:, :-1])  # (2, 16, V)
        for r, n in enumerate(ex.lengths.tolist()):
            alone = model(rows.tokens[r : r + 1, :n])  # (1, n, V)
            torch.testing.assert_close(padded[r, :n], alone[0], atol=1e-5, rtol=1e-5)


def test_resume_under_packing_none_and_answer_loss_is_bitwise(tmp_path: Path) -> None:
    settings = dict(steps=12, save_every=5, grad_accum=2, eval_every=4, seq_len=32)
    cfg = _config(ALGORITHMIC, loss_on="answer", packing="none", **settings)
    cfg.model.dropout = 0.1
    reference, run = tmp_path / "ref", tmp_path / "run"
    train(cfg, reference)

    def crash(event: dict) -> None:
        if event["event"] == "step" and event["step"] == 7:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, run, callback=crash)
    assert read_meta(run)["step"] == 5
    train(cfg, run, resume=True)
    assert same_weights(weights(run), weights(reference))
    assert metrics(run) == metrics(reference)
    assert metrics(run, ("tokens", "scored_tokens")) == metrics(reference, ("tokens", "scored_tokens"))
    tokens, scored = metrics(run, ("tokens", "scored_tokens"))[-1]
    assert scored < tokens < 12 * 2 * 4 * 32  # padding is not processed, prompts are not scored


def test_an_example_longer_than_a_row_is_refused(tmp_path: Path) -> None:
    cfg = _config({**ALGORITHMIC, "max_length": 8}, seq_len=12, packing="none")
    with pytest.raises(ConfigError, match=r"^train.packing=none: the longest training example is \d+ tokens"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key", ["random_positions=32", "pose_length=32", "window_start=document"])
def test_packing_refuses_its_own_positions_with_another_scheme_of_positions(key: str) -> None:
    name, value = key.split("=")
    with pytest.raises(ConfigError, match=f"train.packing=none sets each example's positions itself; train.{name}"):
        _config(ALGORITHMIC, packing="none", **{name: int(value) if value.isdigit() else value}).validate()


def test_cli_trains_algorithmic_answers_one_example_per_row(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["train", "model=tiny", "model.d_model=32", "model.n_layer=1", "model.n_head=2", "data=algorithmic"]
    args += ["data.tasks=[copy]", "data.examples=200", "data.max_length=3", "train.seq_len=32", "train.steps=3"]
    args += ["train.batch_size=4", "train.loss_on=answer", "train.packing=none", "train.device=cpu", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    saved = (out / "config.yaml").read_text()
    assert "loss_on: answer" in saved and "packing: none" in saved
    meta = read_meta(out)
    assert meta["step"] == 3
    # the longest training example and prompt, the competence gate's in-distribution bound (issue #38)
    longest, prompt = meta["data"]["longest_example"], meta["data"]["longest_prompt"]
    assert isinstance(prompt, int) and 1 < prompt < longest <= 32


@pytest.mark.parametrize("scheme", ["rope", "alibi", "t5", "nope"])
def test_packed_examples_score_as_one_example_per_row(scheme: str) -> None:
    """`packing=document`: each example's per-token losses in a packed row equal its `packing=none` row's (1e-5,
    fp32), its positions restarting at 0 and attention kept within it by the document ids."""
    docs = [prompt_answer(f"copy: {'ab' * k}", f" {'ab' * k}") for k in range(1, 6)] + ["plain text"]
    ids, scored = BYTE.encode_scored(docs)
    ids = ids.astype(np.int64)
    ex = find_examples(ids, BYTE.eod_id)
    packed = packed_rows(ids, scored, ex, 3, 40, torch.Generator().manual_seed(0), BYTE.eod_id, answer_only=True)
    assert packed.documents is not None and int(packed.documents.max()) >= 1  # some row holds two examples
    model_cfg = ModelConfig(d_model=32, n_layer=2, n_head=2)
    cfg = Config(model=model_cfg, pos=config_class(scheme)(name=scheme), train=TrainConfig(seq_len=40))
    torch.manual_seed(0)
    model = build_model(cfg, BYTE.vocab_size).eval()
    spans = [ids[s : e + 1].tolist() for s, e in zip(ex.starts, ex.ends, strict=True)]
    with torch.no_grad():
        x, y = packed.tokens[:, :-1], packed.tokens[:, 1:]
        logits = model(x, position_ids=packed.position_ids, documents=packed.documents)  # (3, 40, V)
        nll = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(3, 40)
        compared = 0
        for r in range(3):
            for d in range(int(packed.documents[r].max()) + 1):
                cols = (packed.documents[r] == d).nonzero().flatten()
                pick = spans.index(y[r, cols].tolist())
                alone = example_rows(ids, scored, ex, np.array([pick]), 40, BYTE.eod_id, answer_only=True)
                n = cols.numel()
                solo = model(alone.tokens[:, :n])  # (1, n, V)
                solo_nll = F.cross_entropy(solo[0], alone.tokens[0, 1 : n + 1], reduction="none")
                torch.testing.assert_close(nll[r, cols], solo_nll, atol=1e-5, rtol=0)
                compared += 1
    assert compared >= 4


def test_training_with_packed_examples_runs_and_resumes(tmp_path: Path) -> None:
    cfg = _config(ALGORITHMIC, loss_on="answer", packing="document", steps=6, save_every=3, eval_every=3, seq_len=32)
    reference, run = tmp_path / "ref", tmp_path / "run"
    done = train(cfg, reference)
    assert done.step == 6 and done.val_loss is not None and np.isfinite(done.train_loss)

    def crash(event: dict) -> None:
        if event["event"] == "step" and event["step"] == 4:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, run, callback=crash)
    train(cfg, run, resume=True)
    assert same_weights(weights(run), weights(reference)) and metrics(run) == metrics(reference)
