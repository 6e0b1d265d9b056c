"""LongPPL (Fang et al. 2025): key tokens against a training-length context, on a stub with known log-probabilities,
a property of the thresholds, the short context's exact span, and the fields a tiny run's results file holds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from test_perplexity import fake_corpus, fake_run, tiny_model
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.config import EvalConfig
from posenc_cli.evaluation import longppl as lp
from posenc_cli.evaluation import perplexity as ev
from posenc_cli.evaluation.perplexity import workflow
from posenc_cli.evaluation.results import load_results, results_path
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
    both windows (the stream has period 8): classes 1, 2, 0, 1, so token 6 is the one key token of each window."""
    model = KnownLogProbs(train_length=4)
    keys = lp.KeyTokens(train_length=4)
    res = ev.evaluate_model(model, cycle(40), None, length=8, n_tokens=16, key_tokens=keys)
    assert res["tokens"] == 16 and res["key_tokens"] == 2
    assert res["longppl"] == pytest.approx(math.exp(-logp(6.0)), rel=1e-6)  # = exp(log(e^6 + 7) - 6)
    # the plain perplexity is untouched: the mean over every position of both windows
    plain = [-logp(LOGIT[t % SV % 3][0 if p + 1 > 4 else 1]) for s in (0, 8) for p, t in enumerate(range(s, s + 8))]
    assert res["nll"] == pytest.approx(float(np.mean(plain)), rel=1e-6)
    # the short context never exceeds the training length: 2 long forwards of 8, then forwards of exactly L = 4
    assert model.widths[0] == 8 and set(model.widths[1:]) == {4}


def test_at_or_below_the_training_length_there_are_no_key_tokens() -> None:
    model = KnownLogProbs(train_length=8)
    res = ev.evaluate_model(model, cycle(40), None, length=8, n_tokens=16, key_tokens=lp.KeyTokens(train_length=8))
    assert res["key_tokens"] == 0 and res["longppl"] is None
    assert model.widths == [8]  # no short forward at all


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


def stub_run(tmp_path: Path, train_length: int = 16):
    run = fake_run(tmp_path)
    run.model = KnownLogProbs(train_length)
    return run


def stub_corpus(n: int = 2000):
    corpus = fake_corpus(n)
    corpus.val = cycle(n)
    return corpus


def test_entries_hold_longppl_at_2x_and_cannot_measure_at_1x(tmp_path: Path) -> None:
    run = stub_run(tmp_path)
    out = ev.evaluate_run(run, EvalConfig(lengths=[0.5, 1, 2], tokens=64), corpus=stub_corpus())
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


@pytest.mark.parametrize("protocol", ["sliding", "fixed-target"])
def test_every_protocol_stores_longppl(tmp_path: Path, protocol: str) -> None:
    run = stub_run(tmp_path)
    cfg = EvalConfig(lengths=[1, 2], protocol=protocol, stride=8, target=8, tokens=32)
    out = ev.evaluate_run(run, cfg, corpus=stub_corpus())
    one, two = out["entries"]
    assert one["key_tokens"] == 0 and one["longppl"] is None
    assert two["key_tokens"] > 0 and two["longppl"] == pytest.approx(math.exp(-logp(6.0)), rel=1e-6)


def test_streaming_stores_longppl_and_equals_nonoverlap_when_nothing_is_evicted(tmp_path: Path) -> None:
    run = fake_run(tmp_path)
    corpus = fake_corpus()
    stream = ev.evaluate_run(
        run, EvalConfig(lengths=[2], protocol="streaming", sinks=0, window=64, tokens=64), corpus=corpus
    )
    plain = ev.evaluate_run(run, EvalConfig(lengths=[2], tokens=64), corpus=corpus)
    (s,), (p,) = stream["entries"], plain["entries"]
    assert isinstance(s["key_tokens"], int) and s["key_tokens"] == p["key_tokens"]
    assert (s["longppl"] is None) == (p["longppl"] is None)
    if p["longppl"] is not None:
        assert s["longppl"] == pytest.approx(p["longppl"], rel=1e-4)


def test_stored_entries_without_longppl_are_measured_again_not_shown_as_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = stub_run(tmp_path)
    cfg = EvalConfig(lengths=[1, 2], tokens=64)
    ev.evaluate_run(run, cfg, corpus=stub_corpus(), longppl=False)  # as entries from before LongPPL
    old = load_results(run.path)["entries"]
    assert all("longppl" not in e and "key_tokens" not in e for e in old)
    # without LongPPL asked for, they are reused as they are
    monkeypatch.setattr(workflow, "evaluate_model", lambda *a, **k: pytest.fail("forward without LongPPL asked"))
    assert ev.evaluate_run(run, cfg, corpus=stub_corpus(), longppl=False)["reused"] == 2
    monkeypatch.undo()
    # with it (the default), measured again and replaced in place: same key, same perplexity, now with LongPPL
    out = ev.evaluate_run(run, cfg, corpus=stub_corpus())
    assert out["reused"] == 0
    new = load_results(run.path)["entries"]
    assert len(new) == 2 and [e["nll"] for e in new] == [e["nll"] for e in old]
    assert [e["key_tokens"] for e in new] == [0, out["entries"][1]["key_tokens"]] and new[1]["key_tokens"] > 0
    assert ev.evaluate_run(run, cfg, corpus=stub_corpus())["reused"] == 2  # and then reused


def test_read_entry_types_stored_entries(tmp_path: Path) -> None:
    run = stub_run(tmp_path)
    ev.evaluate_run(run, EvalConfig(lengths=[1, 2], tokens=32), corpus=stub_corpus())
    ev.evaluate_run(run, EvalConfig(lengths=[2], tokens=32), corpus=stub_corpus(), longppl=False, force=True)
    entries = [ev.read_entry(e) for e in json.loads(results_path(run.path).read_text())["entries"]]
    assert [type(e) for e in entries] == [ev.ExtrapolateEntry, ev.ExtrapolateEntry]
    assert entries[0].key_tokens == 0 and entries[1].key_tokens is None  # not measured: no fields, None
    assert [e.to_json() for e in entries] == load_results(run.path)["entries"]
    assert set(ev.ENTRY_FIELDS) >= {"ppl", "longppl", "key_tokens"} and "window" in ev.STREAMING_FIELDS


def test_a_tiny_trained_run_end_to_end(tmp_path: Path) -> None:
    """A trained tiny run, then `posenc eval-extrapolate --lengths 1,2`: eval/extrapolate.json holds key_tokens at
    2x (longppl a number when there are key tokens) and "cannot measure" at 1x."""
    run_dir = tmp_path / "run"
    train(tiny_config(write_corpus(tmp_path), steps=4, eval_every=4, save_every=4), run_dir)
    result = CliRunner().invoke(app, ["eval-extrapolate", str(run_dir), "--lengths", "1,2", "--tokens", "64"])
    assert result.exit_code == 0, result.output
    one, two = load_results(run_dir)["entries"]
    assert one["status"] == two["status"] == "ok"
    assert one["key_tokens"] == 0 and one["longppl"] is None
    assert isinstance(two["key_tokens"], int) and 0 <= two["key_tokens"] <= 32  # candidates: positions 16..31, 2x
    assert (two["longppl"] is None) == (two["key_tokens"] == 0)
    if two["key_tokens"]:
        assert two["longppl"] >= 1.0 and math.isfinite(two["longppl"])


def test_no_longppl_measures_plain_perplexity_only(tmp_path: Path) -> None:
    """`--no-longppl` (eval.longppl=false) writes no LongPPL fields: "not measured", not "cannot measure"."""
    run_dir = tmp_path / "run"
    train(tiny_config(write_corpus(tmp_path), steps=2, eval_every=2, save_every=2), run_dir)
    args = ["eval-extrapolate", str(run_dir), "--lengths", "1,2", "--tokens", "64", "--no-longppl"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    entries = load_results(run_dir)["entries"]
    assert len(entries) == 2 and all("key_tokens" not in e and "longppl" not in e for e in entries)
