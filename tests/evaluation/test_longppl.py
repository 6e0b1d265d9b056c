"""LongPPL (Fang et al. 2025): key tokens against a training-length context, on a stub with known log-probabilities,
a property of the thresholds, the short context's exact span, and the fields a tiny run's results file holds."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from test_perplexity import fake_corpus, fake_run, tiny_model
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli import api
from posenc_cli.cli import app
from posenc_cli.config import EvalConfig
from posenc_cli.errors import CheckpointError, ConfigError
from posenc_cli.evaluation import longppl as lp
from posenc_cli.evaluation.perplexity.entries import ENTRY_FIELDS, STREAMING_FIELDS, ExtrapolateEntry, StreamingEntry
from posenc_cli.evaluation.perplexity.evaluator import KeyEvaluator
from posenc_cli.evaluation.perplexity.measuring import evaluate_model
from posenc_cli.evaluation.perplexity.planning import plan_windows
from posenc_cli.evaluation.results import load_results, results_path
from posenc_cli.evaluation.tasks import extrapolate as extrapolate_task
from posenc_cli.evaluation.tasks.extrapolate import evaluate_run
from posenc_cli.run.train import train

# ---------------------------------------------------------------------------------------------------------------
# A stub whose per-token log-probabilities are known by hand.

SV = 8  # stub vocabulary; the stream is 0, 1, ..., 7, 0, 1, ... and the stub always predicts x + 1 (mod 8)
# logit a of the predicted token (every other logit 0) by the input token's class x % 3, with more than L tokens of
# context ("long") and with at most L ("short"): log p = a - log(e^a + 7)
LOGIT = {0: (6.0, 0.0), 1: (1.0, 0.0), 2: (-3.0, -10.0)}


def logp(a: float) -> float:
    return a - math.log(math.exp(a) + SV - 1)


class KnownLogProbs(torch.nn.Module):
    """Token x at window position t (t + 1 tokens of context) predicts x + 1 with logit LOGIT[x % 3][long or short],
    long when t + 1 > `train_length`. Class 0: LSD = logp(6) - logp(0) = 2.06 > 2 and LCL = -0.017 > -2, a key
    token; class 1: LSD 0.80 < α; class 2: LSD 6.99 but LCL = logp(-3) = -4.95 < β. Records each forward's T."""

    def __init__(self, train_length: int) -> None:
        super().__init__()
        self.train_length = train_length
        self.widths: list[int] = []
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # a parameter, so the run's device can be read off it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T = x.shape
        self.widths.append(T)
        long = (torch.arange(T) + 1 > self.train_length)[None, :].expand(B, T)  # (B, T)
        cls = x % 3
        a = torch.zeros(B, T)
        for c, (a_long, a_short) in LOGIT.items():
            a = torch.where(cls == c, torch.where(long, a_long, a_short), a)
        logits = torch.zeros(B, T, SV)  # (B, T, V)
        logits.scatter_(2, ((x + 1) % SV)[..., None], a[..., None])
        return logits


def cycle(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64) % SV


def test_stub_log_probs_are_what_the_mask_sees() -> None:
    model = KnownLogProbs(train_length=4)
    x = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7]])
    nll = F.cross_entropy(model(x)[0], (x[0] + 1) % SV, reduction="none")
    expected = [-logp(LOGIT[int(t) % 3][0 if p + 1 > 4 else 1]) for p, t in enumerate(x[0])]
    np.testing.assert_allclose(nll.numpy(), expected, rtol=1e-6)


def test_longppl_on_the_stub_by_hand() -> None:
    """L = 4, windows of L' = 8 (nonoverlap, 2 windows). Candidates: positions 4..7, input tokens 4, 5, 6, 7 in
    both windows (the stream has period 8): classes 1, 2, 0, 1, so token 6 is the one key token of each window: the
    targets at stream indices 7 and 15 (position p of a window at s predicts s + p + 1)."""
    model = KnownLogProbs(train_length=4)
    keys = lp.KeyTokens(train_length=4)
    found = evaluate_model(model, cycle(40), None, length=8, n_tokens=16, key_tokens=keys)
    assert found["tokens"] == 16 and found["key_targets"].tolist() == [7, 15]
    # the short context never exceeds the training length: 2 long forwards of 8, then forwards of exactly L = 4
    assert model.widths[0] == 8 and set(model.widths[1:]) == {4}
    res = evaluate_model(model, cycle(40), None, length=8, n_tokens=16, score_keys=found["key_targets"])
    assert res["key_tokens"] == 2 and res["longppl"] == pytest.approx(math.exp(-logp(6.0)), rel=1e-6)
    # the plain perplexity is untouched: the mean over every position of both windows
    plain = [-logp(LOGIT[t % SV % 3][0 if p + 1 > 4 else 1]) for s in (0, 8) for p, t in enumerate(range(s, s + 8))]
    assert res["nll"] == found["nll"] == pytest.approx(float(np.mean(plain)), rel=1e-6)


def test_at_or_below_the_training_length_there_are_no_key_tokens() -> None:
    model = KnownLogProbs(train_length=8)
    res = evaluate_model(model, cycle(40), None, length=8, n_tokens=16, key_tokens=lp.KeyTokens(train_length=8))
    assert res["key_targets"].tolist() == []
    assert model.widths == [8]  # no short forward at all
    scored = evaluate_model(model, cycle(40), None, length=8, n_tokens=16, score_keys=res["key_targets"])
    assert scored["key_tokens"] == 0 and scored["longppl"] is None


def window_nll(model: torch.nn.Module, tokens: np.ndarray, length: int, starts: list[int], stride: int):
    """Stream index -> the model's NLL of that target in the window at s that scores it (its last `stride`)."""
    out = {}
    with torch.inference_mode():
        for s in starts:
            x = torch.from_numpy(tokens[s : s + length + 1].astype(np.int64))[None]
            nll = F.cross_entropy(model(x[:, :-1])[0], x[0, 1:], reduction="none")
            out.update({s + p + 1: float(nll[p]) for p in range(length - stride, length)})
    return out


@pytest.mark.parametrize("protocol", ["nonoverlap", "sliding"])
def test_the_evaluated_model_is_scored_exactly_on_the_evaluators_key_tokens(protocol: str) -> None:
    """The stub evaluator picks the targets after class-0 inputs beyond L; a different model (a random tiny RoPE) is
    scored on exactly those targets: its LongPPL is exp(mean of its own NLL there), computed by hand."""
    evaluator, evaluated = KnownLogProbs(train_length=4), tiny_model("rope")
    tokens, length = cycle(200), 8
    stride = 8 if protocol == "nonoverlap" else 4
    found = evaluate_model(
        evaluator, tokens, None, length=length, protocol=protocol, stride=stride, n_tokens=32,
        key_tokens=lp.KeyTokens(train_length=4),
    )  # fmt: skip
    targets = found["key_targets"].tolist()
    starts = [int(s) for s in plan_windows(len(tokens), length, stride, 32, protocol)]
    # the protocol's scored targets t = s + p + 1 at window positions p: key where p + 1 > L and input class 0
    scored = [(s + p + 1, p) for s in starts for p in range(length - stride, length)]
    expected = sorted(t for t, p in scored if p + 1 > 4 and (t - 1) % SV % 3 == 0)
    assert targets == expected and targets
    res = evaluate_model(
        evaluated, tokens, None, length=length, protocol=protocol, stride=stride, n_tokens=32,
        score_keys=found["key_targets"],
    )  # fmt: skip
    nll = window_nll(evaluated, tokens, length, starts, stride)
    assert res["key_tokens"] == len(targets)
    assert res["longppl"] == pytest.approx(math.exp(np.mean([nll[t] for t in targets])), rel=1e-5)


def test_key_token_mask_and_longppl_by_hand() -> None:
    logp_long = torch.tensor([-0.5, -0.5, -2.5, -1.9, -1.0])
    logp_short = torch.tensor([-3.0, -2.4, -9.0, -4.0, -3.0])
    # LSD 2.5 (key), 1.9 (< α), 6.5 with LCL -2.5 (< β), 2.1 with LCL -1.9 (key), 2.0 (not > α)
    mask = lp.key_token_mask(logp_long, logp_short)
    assert mask.tolist() == [True, False, False, True, False]
    assert lp.longppl(-logp_long, mask) == pytest.approx(math.exp((0.5 + 1.9) / 2))
    assert lp.longppl(-logp_long, torch.zeros(5, dtype=torch.bool)) is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-20, 0), st.floats(-20, 0)), min_size=1, max_size=30),
    st.floats(-5, 10),
    st.floats(0, 10),
    st.floats(-10, 0),
)
def test_raising_alpha_never_adds_key_tokens(pairs: list[tuple[float, float]], alpha: float, more: float, beta: float):
    logp_long = torch.tensor([a for a, _ in pairs], dtype=torch.float64)
    logp_short = torch.tensor([b for _, b in pairs], dtype=torch.float64)
    low = lp.key_token_mask(logp_long, logp_short, alpha, beta)
    high = lp.key_token_mask(logp_long, logp_short, alpha + more, beta)
    assert not (high & ~low).any()  # every key token at the higher α is one at the lower α
    assert int(high.sum()) <= int(low.sum())


def test_short_blocks_and_candidates() -> None:
    assert lp.short_block(128) == 32 and lp.short_block(3) == 1
    assert lp.candidate_positions(16, 16, 16) is None  # 1x: none
    assert lp.candidate_positions(32, 32, 16) == (16, 31)  # nonoverlap 2x: positions 16..31 (17..32 tokens seen)
    assert lp.candidate_positions(32, 8, 16) == (24, 31)  # sliding: only the scored ones
    assert lp.short_blocks(16, 31, 4) == [(16, 19), (20, 23), (24, 27), (28, 31)]
    assert lp.short_blocks(16, 25, 4) == [(16, 19), (20, 23), (24, 25)]  # the last block shorter


def test_each_target_sees_exactly_the_tokens_the_docstring_says() -> None:
    """Target p of block [p0, p1] is predicted from the L - (p1 - p) tokens right before it: the same NLL as a
    forward over exactly those tokens (the model is causal), at positions 0..L-(p1-p)-1."""
    model = tiny_model("rope")
    tokens = np.arange(300, dtype=np.int64) * 7 % 250
    L, length, block = 16, 40, 6
    starts = np.array([0, 40, 80])
    keys = lp.KeyTokens(train_length=L, block=block)
    with torch.inference_mode():
        got = lp.short_context_nll(
            model, tokens, starts, L, length - 1, keys, batch_tokens=50, dtype="fp32", device=torch.device("cpu")
        )
        assert got.shape == (3, length - L)
        for k, s in enumerate(starts):
            for p0, p1 in lp.short_blocks(L, length - 1, block):
                for p in range(p0, p1 + 1):
                    first = s + p1 + 1 - L  # the short window's first input
                    x = torch.from_numpy(tokens[first : s + p + 1])[None]  # its inputs up to target p's
                    assert x.shape[1] == L - (p1 - p)
                    ref = F.cross_entropy(model(x)[0, -1:], torch.tensor([int(tokens[s + p + 1])]))
                    assert float(got[k, p - L]) == pytest.approx(float(ref), rel=1e-5, abs=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# In the results file


def stub_run(tmp_path: Path, train_length: int = 16, name: str = "run-a", step: int = 0):
    run = fake_run(tmp_path, name=name)
    run.model = KnownLogProbs(train_length)
    run.meta = replace(run.meta, step=step)
    return run


def stub_corpus(n: int = 2000):
    corpus = fake_corpus(n)
    corpus.val = cycle(n)
    return corpus


def test_entries_hold_longppl_at_2x_and_cannot_measure_at_1x(tmp_path: Path) -> None:
    run = stub_run(tmp_path)
    cfg = EvalConfig(lengths=[0.5, 1, 2], tokens=64)
    out = evaluate_run(run, cfg, corpus=stub_corpus(), evaluator=KeyEvaluator(run))
    by_len = {e["length"]: e for e in load_results(run.path)["entries"]}
    assert by_len == {e["length"]: e for e in out["entries"]}
    for n in (8, 16):  # at L' <= L: cannot be measured, said as 0 key tokens and no value
        assert by_len[n]["key_tokens"] == 0 and by_len[n]["longppl"] is None
    # 2x: windows of 32, candidates at positions 16..31 (inputs s+16..s+31, s a multiple of 32 and of 8): 16
    # tokens per window, each input class cycling with period 24; 64 tokens = 2 windows
    expected = sum(1 for s in (0, 32) for p in range(16, 32) if (s + p) % SV % 3 == 0)
    assert by_len[32]["key_tokens"] == expected > 0
    assert by_len[32]["longppl"] == pytest.approx(math.exp(-logp(6.0)), rel=1e-6)
    assert list(by_len[32]).index("longppl") == list(by_len[32]).index("bpb") + 1  # beside the plain scores
    assert by_len[32]["longppl_evaluator"]["run"] == "run-a"
    assert by_len[32]["longppl_evaluator"]["checkpoint"] == by_len[32]["checkpoint"]
    # the key set is stored in the evaluator's directory with what it measured
    stored = json.loads((run.path / lp.KEYS_DIR / f"{by_len[32]['longppl_evaluator']['keys']}.json").read_text())
    assert stored["key_tokens"] == expected and stored["identity"]["length"] == 32
    assert stored["identity"]["alpha"] == 2.0 and stored["identity"]["beta"] == -2.0
    assert stored["identity"]["short_context"] == 16 and stored["identity"]["data"]["fingerprint"] == "fp-1"


@pytest.mark.parametrize("protocol", ["sliding", "fixed-target"])
def test_every_window_protocol_stores_longppl(tmp_path: Path, protocol: str) -> None:
    run = stub_run(tmp_path)
    windows = {"stride": 8} if protocol == "sliding" else {"target": 8}  # each protocol's own setting
    cfg = EvalConfig(lengths=[1, 2], protocol=protocol, tokens=32, **windows)
    out = evaluate_run(run, cfg, corpus=stub_corpus(), evaluator=KeyEvaluator(run))
    one, two = out["entries"]
    assert one["key_tokens"] == 0 and one["longppl"] is None
    assert two["key_tokens"] > 0 and two["longppl"] == pytest.approx(math.exp(-logp(6.0)), rel=1e-6)


def test_streaming_has_no_evaluator_longppl(tmp_path: Path) -> None:
    run = stub_run(tmp_path)
    cfg = EvalConfig(lengths=[2], protocol="streaming", sinks=0, window=16, tokens=64)
    with pytest.raises(ConfigError, match="streaming"):
        evaluate_run(run, cfg, corpus=stub_corpus(), evaluator=KeyEvaluator(run))
    with pytest.raises(ConfigError, match="streaming"):
        EvalConfig(protocol="streaming", longppl_evaluator="somewhere").validate()


def test_without_an_evaluator_no_longppl_is_measured(tmp_path: Path) -> None:
    run = stub_run(tmp_path)
    out = evaluate_run(run, EvalConfig(lengths=[1, 2], tokens=64), corpus=stub_corpus())
    assert all(not {"longppl", "key_tokens", "longppl_evaluator"} & set(e) for e in out["entries"])


def test_two_runs_are_scored_on_the_same_key_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run b's own key tokens would differ (its stub has another training length), but both runs are scored on the
    evaluator's: the same count and key set; the evaluator chooses them once (one key-token pass)."""
    a, b = stub_run(tmp_path, name="run-a"), stub_run(tmp_path, 8, name="run-b")
    evaluator = KeyEvaluator(a)
    chosen = []
    original = KeyEvaluator._choose
    monkeypatch.setattr(KeyEvaluator, "_choose", lambda self, *args: chosen.append(1) or original(self, *args))
    cfg = EvalConfig(lengths=[2], tokens=64)
    (ea,) = evaluate_run(a, cfg, corpus=stub_corpus(), evaluator=evaluator)["entries"]
    (eb,) = evaluate_run(b, cfg, corpus=stub_corpus(), evaluator=evaluator)["entries"]
    assert chosen == [1]
    assert ea["longppl_evaluator"] == eb["longppl_evaluator"] and ea["key_tokens"] == eb["key_tokens"] > 0
    # b beyond its own L = 8 everywhere: class-0 targets are predicted with the long logit, as for a
    assert eb["longppl"] == pytest.approx(math.exp(-logp(6.0)), rel=1e-6)
    # a new process (no memory) reads the stored set instead of choosing again
    (again,) = evaluate_run(b, cfg, corpus=stub_corpus(), evaluator=KeyEvaluator(a), force=True)["entries"]
    assert chosen == [1] and again["longppl"] == eb["longppl"]


def test_the_key_set_changes_with_the_evaluator(tmp_path: Path) -> None:
    """Another evaluator (another checkpoint) is another key set: the stored entry is measured again, not reused,
    and records the new one; the same evaluator reuses it."""
    run, other = stub_run(tmp_path), stub_run(tmp_path, name="run-e", step=7)
    cfg = EvalConfig(lengths=[2], tokens=64)
    first = evaluate_run(run, cfg, corpus=stub_corpus(), evaluator=KeyEvaluator(run))
    assert evaluate_run(run, cfg, corpus=stub_corpus(), evaluator=KeyEvaluator(run))["reused"] == 1
    second = evaluate_run(run, cfg, corpus=stub_corpus(), evaluator=KeyEvaluator(other))
    assert second["reused"] == 0
    (e1,), (e2,) = first["entries"], second["entries"]
    assert e1["longppl_evaluator"]["keys"] != e2["longppl_evaluator"]["keys"]
    assert e2["longppl_evaluator"]["run"] == "run-e" and e2["longppl_evaluator"]["checkpoint"]["step"] == 7
    assert len(load_results(run.path)["entries"]) == 1  # replaced in place
    ident = dict(
        data={"name": "x", "fingerprint": "f"}, tokenizer="byte", protocol="nonoverlap", stride=None, length=32,
        tokens=64, settings=lp.KeyTokens(train_length=16), dtype="fp32", positions={"mode": "sequential"},
    )  # fmt: skip
    ids = {lp.keys_id(lp.keys_identity(evaluator={"step": s, "model_sha256": h}, **ident)) for s, h in
           ((0, "a"), (1, "a"), (0, "b"))}  # fmt: skip
    assert len(ids) == 3


def test_a_run_with_another_tokenizer_is_refused_in_one_line(tmp_path: Path) -> None:
    evaluator, run = stub_run(tmp_path), stub_run(tmp_path, name="run-b")
    run.tokenizer = SimpleNamespace(token_bytes=run.tokenizer.token_bytes, fingerprint="bpe-512")
    with pytest.raises(ConfigError, match=r"its tokenizer \(bpe-512\) is not the LongPPL evaluator's \(byte") as e:
        evaluate_run(run, EvalConfig(lengths=[2], tokens=64), corpus=stub_corpus(), evaluator=KeyEvaluator(evaluator))
    assert "\n" not in str(e.value) and load_results(run.path, missing_ok=True) is None


def test_stored_entries_of_the_old_kind_are_measured_again_not_shown_as_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = stub_run(tmp_path)
    cfg = EvalConfig(lengths=[1, 2], tokens=64)
    evaluate_run(run, cfg, corpus=stub_corpus(), longppl=False)  # as entries from before LongPPL
    old = load_results(run.path)["entries"]
    assert all("longppl" not in e and "key_tokens" not in e for e in old)
    # the self-chosen kind of an older posenc: longppl and key_tokens but no evaluator
    doc = json.loads(results_path(run.path).read_text())
    doc["entries"] = [{**e, "longppl": 1.5, "key_tokens": 3} for e in doc["entries"]]
    results_path(run.path).write_text(json.dumps(doc))
    # without LongPPL asked for, they are reused as they are
    monkeypatch.setattr(
        extrapolate_task, "evaluate_model", lambda *a, **k: pytest.fail("forward without LongPPL asked")
    )
    assert evaluate_run(run, cfg, corpus=stub_corpus(), longppl=False)["reused"] == 2
    monkeypatch.undo()
    # with an evaluator, measured again and replaced in place: same key, same perplexity, the evaluator's LongPPL
    out = evaluate_run(run, cfg, corpus=stub_corpus(), evaluator=KeyEvaluator(run))
    assert out["reused"] == 0
    new = load_results(run.path)["entries"]
    assert len(new) == 2 and [e["nll"] for e in new] == [e["nll"] for e in old]
    assert [e["key_tokens"] for e in new] == [0, out["entries"][1]["key_tokens"]] and new[1]["key_tokens"] > 0
    assert all(e["longppl_evaluator"]["run"] == "run-a" for e in new)
    assert evaluate_run(run, cfg, corpus=stub_corpus(), evaluator=KeyEvaluator(run))["reused"] == 2


def read_entry(stored: dict[str, object]) -> ExtrapolateEntry:
    """A stored entry as its dataclass (`StreamingEntry` for the streaming protocol); CheckpointError for an object
    with a key this posenc does not write, or without one that has no default."""
    streaming = stored.get("protocol") == "streaming"
    kind = StreamingEntry if streaming else ExtrapolateEntry
    names = STREAMING_FIELDS if streaming else ENTRY_FIELDS
    unknown = sorted(set(stored) - set(names))
    if unknown:
        raise CheckpointError(f"an eval-extrapolate entry has keys this posenc does not know: {', '.join(unknown)}")
    values = dict(stored)
    if streaming and "decode" not in values:
        values["decode"] = "recompute"  # entries from before the KV cache re-encoded the kept tokens
    try:
        return kind(**values)
    except TypeError as e:
        raise CheckpointError(f"an eval-extrapolate entry lacks a field: {e}") from e


def test_read_entry_types_stored_entries(tmp_path: Path) -> None:
    run = stub_run(tmp_path)
    evaluate_run(run, EvalConfig(lengths=[1, 2], tokens=32), corpus=stub_corpus(), evaluator=KeyEvaluator(run))
    evaluate_run(run, EvalConfig(lengths=[2], tokens=32), corpus=stub_corpus(), longppl=False, force=True)
    entries = [read_entry(e) for e in json.loads(results_path(run.path).read_text())["entries"]]
    assert [type(e) for e in entries] == [ExtrapolateEntry, ExtrapolateEntry]
    assert entries[0].key_tokens == 0 and entries[1].key_tokens is None  # not measured: no fields, None
    assert entries[0].longppl_evaluator is not None and entries[1].longppl_evaluator is None
    assert [e.to_json() for e in entries] == load_results(run.path)["entries"]
    assert set(ENTRY_FIELDS) >= {"ppl", "longppl", "key_tokens", "longppl_evaluator"}
    assert "window" in STREAMING_FIELDS


def test_a_tiny_trained_run_end_to_end(tmp_path: Path) -> None:
    """A trained tiny run, then `posenc eval-extrapolate --lengths 1,2 --longppl-evaluator RUN`: eval/extrapolate.json
    holds key_tokens at 2x (longppl a number when there are key tokens) and "cannot measure" at 1x."""
    run_dir = tmp_path / "run"
    train(tiny_config(write_corpus(tmp_path), steps=4, eval_every=4, save_every=4), run_dir)
    args = ["eval-extrapolate", str(run_dir), "--lengths", "1,2", "--tokens", "64", "--longppl-evaluator", str(run_dir)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    one, two = load_results(run_dir)["entries"]
    assert one["status"] == two["status"] == "ok"
    assert one["key_tokens"] == 0 and one["longppl"] is None
    assert isinstance(two["key_tokens"], int) and 0 <= two["key_tokens"] <= 32  # candidates: positions 16..31, 2x
    assert (two["longppl"] is None) == (two["key_tokens"] == 0)
    if two["key_tokens"]:
        assert two["longppl"] >= 1.0 and math.isfinite(two["longppl"])


def test_evaluator_flag_api_parameter_and_refusals(tmp_path: Path) -> None:
    """`--longppl-evaluator` and `api.evaluate(longppl_evaluator=)` score the run on the evaluator's key set; a
    missing directory or one that is not a run is refused in one line, exit 2, before anything is measured;
    `--no-longppl` (eval.longppl=false) writes no LongPPL fields even with an evaluator."""
    run_dir, other = tmp_path / "run", tmp_path / "other"
    corpus = write_corpus(tmp_path)
    train(tiny_config(corpus, steps=2, eval_every=2, save_every=2), run_dir)
    train(tiny_config(corpus, steps=2, eval_every=2, save_every=2, seed=1), other)
    (tmp_path / "plain").mkdir()
    base = ["eval-extrapolate", str(run_dir), "--lengths", "2", "--tokens", "64"]
    for bad, why in ((tmp_path / "absent", "no such directory"), (tmp_path / "plain", "not a posenc run directory")):
        result = CliRunner().invoke(app, [*base, "--longppl-evaluator", str(bad)])
        assert result.exit_code == 2 and why in result.output and len(result.output.strip().splitlines()) == 1
        assert load_results(run_dir, missing_ok=True) is None  # refused before anything was measured
    with pytest.raises(ConfigError, match="no such directory"):
        api.evaluate([run_dir], lengths=[2], tokens=64, longppl_evaluator=tmp_path / "absent")
    result = CliRunner().invoke(app, [*base, "--longppl-evaluator", str(other)])
    assert result.exit_code == 0, result.output
    (entry,) = load_results(run_dir)["entries"]
    assert entry["longppl_evaluator"]["run"] == "other" and (other / lp.KEYS_DIR).is_dir()
    (found,) = api.evaluate([run_dir], lengths=[2], tokens=64, longppl_evaluator=other).results[0]["entries"]
    assert found == entry  # reused: the same key set
    (own,) = api.evaluate([run_dir], lengths=[2], tokens=64, longppl_evaluator=run_dir).results[0]["entries"]
    assert (
        own["longppl_evaluator"]["run"] == "run"
        and own["longppl_evaluator"]["keys"] != entry["longppl_evaluator"]["keys"]
    )
    result = CliRunner().invoke(app, [*base, "--force", "--no-longppl", "--longppl-evaluator", str(other)])
    assert result.exit_code == 0, result.output
    (entry,) = load_results(run_dir)["entries"]
    assert not {"longppl", "key_tokens", "longppl_evaluator"} & set(entry)
