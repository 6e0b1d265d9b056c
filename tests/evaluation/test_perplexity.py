"""Perplexity vs length: numerics against hand-computed cross-entropy, protocols, results file semantics."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scheme_utils import n_layer_for

from posenc_cli.config import Config, EvalConfig, ModelConfig, TrainConfig
from posenc_cli.data.sources.stdlib import StdlibDataConfig
from posenc_cli.errors import CheckpointError, ConfigError, LengthBeyondScheme
from posenc_cli.evaluation.corpus import data_config_with_overrides
from posenc_cli.evaluation.perplexity import planning
from posenc_cli.evaluation.perplexity.evaluator import KeyEvaluator
from posenc_cli.evaluation.perplexity.measuring import evaluate_model
from posenc_cli.evaluation.perplexity.planning import (
    no_window_reason,
    plan_lengths,
    plan_windows,
    resolve_dtype,
    resolve_stride,
)
from posenc_cli.evaluation.results import load_results, results_path
from posenc_cli.evaluation.runs import find_runs
from posenc_cli.evaluation.tasks import extrapolate as extrapolate_task
from posenc_cli.evaluation.tasks.extrapolate import evaluate_run
from posenc_cli.model import GPT
from posenc_cli.positional import config_class, registry
from posenc_cli.run.meta import RunMeta

V = 257  # byte vocabulary + end-of-document
TRAIN_LEN = 16


def tiny_model(scheme: str = "nope", seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    mcfg = ModelConfig(d_model=32, n_layer=n_layer_for(scheme), n_head=2, init_std=0.2)
    return GPT(mcfg, config_class(scheme)(name=scheme), V, TRAIN_LEN).eval()


def byte_stream(n: int, seed: int = 0) -> np.ndarray:
    text = "".join(f"line {i}: the quick brown fox {i * 7 % 13} jumps.\n" for i in range(n))
    ids = np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int32)
    return ids[:n]


BYTE_TOKEN_BYTES = np.array([1] * 256 + [0], dtype=np.int64)  # eod (256) has no bytes


def hand_nll(model: torch.nn.Module, tokens: np.ndarray, starts: list[int], length: int, scored: int) -> list[float]:
    """Reference: one window at a time, F.cross_entropy on the last `scored` targets, as a flat list of NLLs."""
    out: list[float] = []
    with torch.no_grad():
        for s in starts:
            x = torch.tensor(tokens[s : s + length], dtype=torch.long)[None]
            y = torch.tensor(tokens[s + 1 : s + length + 1], dtype=torch.long)
            logits = model(x)[0]
            out += F.cross_entropy(logits[-scored:], y[-scored:], reduction="none").tolist()
    return out


# ---------------------------------------------------------------------------------------------------------------
# Planning


def test_plan_windows_budget_and_availability() -> None:
    assert plan_windows(1000, 16, 16, 64).tolist() == [0, 16, 32, 48]
    assert plan_windows(1000, 16, 16, 65).tolist() == [0, 16, 32, 48, 64]  # rounded up to whole windows
    # stream of 50 tokens: windows need s + 17 <= 50 -> s in {0, 16, 32}
    assert plan_windows(50, 16, 16, 10_000).tolist() == [0, 16, 32]
    assert plan_windows(16, 16, 16, 100).size == 0  # one window needs 17 tokens
    assert plan_windows(17, 16, 16, 100).tolist() == [0]
    assert plan_windows(1000, 16, 4, 10).tolist() == [0, 4, 8]  # sliding: 3 windows x 4 scored >= 10


def test_plan_lengths_multiples_and_absolute() -> None:
    cfg = EvalConfig(lengths=[0.5, 1, 2, 2.0])
    assert plan_lengths(cfg, 16) == [(8, 0.5), (16, 1.0), (32, 2.0)]
    cfg = EvalConfig(abs_lengths=[64, 8])
    assert plan_lengths(cfg, 16) == [(8, 0.5), (64, 4.0)]


def test_resolve_stride_and_dtype() -> None:
    assert resolve_stride("nonoverlap", 3, 32) == 32
    assert resolve_stride("sliding", None, 32) == 16
    assert resolve_stride("sliding", 100, 32) == 32
    assert resolve_dtype("auto", "bf16") == "bf16"
    assert resolve_dtype("auto", "fp32") == "fp32"
    assert RunMeta(step=0).precision == "fp32"  # runs from before the record say nothing
    assert resolve_dtype("fp32", "bf16") == "fp32"
    assert resolve_dtype("bf16", "fp32", torch.device("cpu")) == "bf16"  # explicit wins


def test_auto_dtype_avoids_emulated_bf16_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planning, "cpu_has_fast_bf16", lambda: False)  # run.device's, as planning imported it
    assert resolve_dtype("auto", "bf16", torch.device("cpu")) == "fp32"
    monkeypatch.setattr(planning, "cpu_has_fast_bf16", lambda: True)
    assert resolve_dtype("auto", "bf16", torch.device("cpu")) == "bf16"


# ---------------------------------------------------------------------------------------------------------------
# Numerics


@pytest.mark.parametrize("scheme", ["nope", "alibi"])
def test_ppl_is_exp_of_hand_computed_cross_entropy(scheme: str) -> None:
    model = tiny_model(scheme)
    tokens = byte_stream(400)
    L = 24
    res = evaluate_model(model, tokens, BYTE_TOKEN_BYTES, length=L, n_tokens=100, batch_tokens=50)
    starts = [0, 24, 48, 72, 96]  # ceil(100 / 24) = 5 windows
    ref = hand_nll(model, tokens, starts, L, L)
    assert res["tokens"] == len(ref) == 5 * L
    assert res["nll"] == pytest.approx(float(np.mean(ref)), rel=1e-5)
    assert res["ppl"] == pytest.approx(math.exp(np.mean(ref)), rel=1e-5)


def test_sliding_reference_and_stride_equal_length_is_nonoverlap() -> None:
    model = tiny_model("nope")
    tokens = byte_stream(300)
    L = 20
    slide = evaluate_model(model, tokens, BYTE_TOKEN_BYTES, length=L, protocol="sliding", stride=5, n_tokens=30)
    ref = hand_nll(model, tokens, [0, 5, 10, 15, 20, 25], L, 5)
    assert slide["tokens"] == 30 and len(slide["per_position"]) == 5
    assert slide["nll"] == pytest.approx(float(np.mean(ref)), rel=1e-5)

    kwargs = {"length": L, "n_tokens": 60, "batch_tokens": 40}
    a = evaluate_model(model, tokens, BYTE_TOKEN_BYTES, protocol="nonoverlap", **kwargs)
    b = evaluate_model(model, tokens, BYTE_TOKEN_BYTES, protocol="sliding", stride=L, **kwargs)
    assert a["tokens"] == b["tokens"] == 60
    assert a["nll"] == pytest.approx(b["nll"], rel=1e-6)
    np.testing.assert_allclose(a["per_position"], b["per_position"], rtol=1e-6)


def test_per_position_averages_back_and_matches_reference() -> None:
    model = tiny_model("nope")
    tokens = byte_stream(500)
    L = 16
    res = evaluate_model(model, tokens, BYTE_TOKEN_BYTES, length=L, n_tokens=160, batch_tokens=48)
    assert len(res["per_position"]) == L
    assert float(np.mean(res["per_position"])) == pytest.approx(res["nll"], rel=1e-9)
    ref = np.array(hand_nll(model, tokens, list(range(0, 160, 16)), L, L)).reshape(10, L).mean(0)
    np.testing.assert_allclose(res["per_position"], ref, rtol=1e-5)


def test_batching_does_not_change_numbers() -> None:
    model = tiny_model("alibi")
    tokens = byte_stream(600)
    a = evaluate_model(model, tokens, BYTE_TOKEN_BYTES, length=32, n_tokens=256, batch_tokens=32)
    b = evaluate_model(model, tokens, BYTE_TOKEN_BYTES, length=32, n_tokens=256, batch_tokens=10_000)
    assert a["nll"] == pytest.approx(b["nll"], rel=1e-6)


def test_bits_per_byte_byte_tokenizer_with_eod() -> None:
    model = tiny_model("nope")
    tokens = byte_stream(200).copy()
    tokens[[30, 31, 77]] = 256  # end-of-document tokens carry no bytes
    L = 16
    res = evaluate_model(model, tokens, BYTE_TOKEN_BYTES, length=L, n_tokens=96)
    targets = tokens[1 : 96 + 1]
    text_bytes = len(bytes(int(t) for t in targets if t < 256))
    assert res["bytes"] == text_bytes == 96 - 3
    total = sum(hand_nll(model, tokens, list(range(0, 96, 16)), L, L))
    assert res["bpb"] == pytest.approx(total / (math.log(2) * text_bytes), rel=1e-5)


def test_bits_per_byte_multibyte_tokens() -> None:
    """A tokenizer whose tokens have different byte lengths: bpb divides by the scored tokens' bytes."""
    model = tiny_model("nope")
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, V, size=300).astype(np.int64)
    token_bytes = rng.integers(0, 6, size=V).astype(np.int64)
    res = evaluate_model(model, tokens, token_bytes, length=16, protocol="sliding", stride=4, n_tokens=40)
    scored = np.concatenate([tokens[s + 1 + 12 : s + 17] for s in range(0, 40, 4)])
    assert res["bytes"] == int(token_bytes[scored].sum())
    assert res["bpb"] == pytest.approx(res["nll"] * res["tokens"] / (math.log(2) * res["bytes"]), rel=1e-12)


def test_bf16_close_to_fp32() -> None:
    model = tiny_model("nope")
    tokens = byte_stream(300)
    a = evaluate_model(model, tokens, BYTE_TOKEN_BYTES, length=16, n_tokens=64, dtype="fp32")
    b = evaluate_model(model, tokens, BYTE_TOKEN_BYTES, length=16, n_tokens=64, dtype="bf16")
    assert b["nll"] == pytest.approx(a["nll"], rel=0.05)


def test_learned_beyond_table_raises_before_any_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("learned")
    monkeypatch.setattr(model, "forward", lambda *a, **k: pytest.fail("no forward expected"))
    with pytest.raises(LengthBeyondScheme):
        evaluate_model(model, byte_stream(300), BYTE_TOKEN_BYTES, length=TRAIN_LEN * 2, n_tokens=64)


# ---------------------------------------------------------------------------------------------------------------
# evaluate_run and the results file (a loaded run stand-in: no checkpoint or data module needed)


def fake_run(tmp_path: Path, scheme: str = "nope", name: str = "run-a", precision: str = "fp32") -> SimpleNamespace:
    path = tmp_path / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "meta.json").write_text(json.dumps({"kind": "posenc-run", "train_length": TRAIN_LEN}))
    cfg = Config(
        model=ModelConfig(d_model=32, n_layer=n_layer_for(scheme), n_head=2),
        pos=config_class(scheme)(name=scheme),
        train=TrainConfig(seq_len=TRAIN_LEN),
    )
    tok = SimpleNamespace(token_bytes=BYTE_TOKEN_BYTES, fingerprint="byte")
    meta = RunMeta(step=0, train_length=TRAIN_LEN, base_length=TRAIN_LEN, record={"precision": precision})
    return SimpleNamespace(
        path=path, model=tiny_model(scheme), config=cfg, meta=meta, tokenizer=tok, scheme_label=scheme
    )


def fake_corpus(n: int = 2000, fingerprint: str = "fp-1") -> SimpleNamespace:
    return SimpleNamespace(val=byte_stream(n), info={"fingerprint": fingerprint})


def test_evaluate_run_writes_schema_and_na_for_learned(tmp_path: Path) -> None:
    run = fake_run(tmp_path, "learned")
    cfg = EvalConfig(lengths=[0.5, 1, 2], tokens=64)
    out = evaluate_run(run, cfg, corpus=fake_corpus(), evaluator=KeyEvaluator(run))
    doc = load_results(run.path)
    assert set(doc) == {"schema_version", "run", "scheme", "train_length", "base_length", "entries"}
    assert doc["schema_version"] == 1 and doc["scheme"] == "learned" and doc["run"] == "run-a"
    keys = {"protocol", "stride", "length", "multiple", "tokens", "dtype", "data", "status", "reason", "ppl", "nll"}
    keys |= {"bpb", "per_position", "posenc_version", "created", "checkpoint", "device", "positions"}
    measured = keys | {"longppl", "key_tokens", "longppl_evaluator"}  # LongPPL is stored for measured cells only
    assert all(set(e) == (measured if e["status"] == "ok" else keys) for e in doc["entries"])
    by_len = {e["length"]: e for e in out["entries"]}
    assert [by_len[n]["status"] for n in (8, 16, 32)] == ["ok", "ok", "n/a"]
    assert "at most 16 positions" in by_len[32]["reason"] and by_len[32]["ppl"] is None
    assert by_len[16]["stride"] is None and by_len[16]["tokens"] == 64 and by_len[16]["multiple"] == 1.0
    assert by_len[16]["data"] == {"name": "stdlib", "fingerprint": "fp-1"}
    assert by_len[16]["dtype"] == "fp32" and by_len[16]["positions"] == {"mode": "sequential"}


def test_split_shorter_than_window_is_na_with_reason(tmp_path: Path) -> None:
    run = fake_run(tmp_path)
    out = evaluate_run(run, EvalConfig(abs_lengths=[8, 64], tokens=32), corpus=fake_corpus(40))
    short = out["entries"][1]
    # a short corpus is its own state, not the scheme's limit (which is "n/a")
    assert short["status"] == "too_few_tokens" and short["tokens"] == 0 and "40 tokens" in short["reason"]
    # too short for the budget: uses what exists and records the actual count (40 tokens -> 4 windows of 8)
    assert out["entries"][0]["status"] == "ok" and out["entries"][0]["tokens"] == 32
    out = evaluate_run(run, EvalConfig(abs_lengths=[8], tokens=1000), corpus=fake_corpus(40))
    assert out["entries"][0]["tokens"] == 32  # (40 - 9) // 8 + 1 = 4 windows


def test_results_merge_replace_and_reuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = fake_run(tmp_path)
    corpus = fake_corpus()
    evaluate_run(run, EvalConfig(lengths=[1, 2], tokens=64), corpus=corpus)
    evaluate_run(run, EvalConfig(lengths=[1], tokens=128), corpus=corpus)  # other budget: a new entry
    evaluate_run(run, EvalConfig(lengths=[1], protocol="sliding", tokens=64), corpus=corpus)
    doc = load_results(run.path)
    assert [(e["protocol"], e["length"], e["tokens"]) for e in doc["entries"]] == [
        ("nonoverlap", 16, 64),
        ("nonoverlap", 32, 64),
        ("nonoverlap", 16, 128),
        ("sliding", 16, 64),
    ]
    assert doc["entries"][3]["stride"] == 8

    # same options again: no forward at all, entries reused
    monkeypatch.setattr(extrapolate_task, "evaluate_model", lambda *a, **k: pytest.fail("forward without --force"))
    out = evaluate_run(run, EvalConfig(lengths=[1, 2], tokens=64), corpus=corpus)
    assert out["reused"] == 2 and [e["length"] for e in out["entries"]] == [16, 32]
    monkeypatch.undo()

    # --force recomputes and replaces in place; other data is a different key
    before = json.loads(results_path(run.path).read_text())
    out = evaluate_run(run, EvalConfig(lengths=[1], tokens=64, force=True), corpus=corpus)
    assert out["reused"] == 0
    after = load_results(run.path)
    assert len(after["entries"]) == 4 and after["entries"][0]["nll"] == pytest.approx(before["entries"][0]["nll"])
    evaluate_run(run, EvalConfig(lengths=[1], tokens=64), corpus=fake_corpus(fingerprint="fp-2"))
    assert len(load_results(run.path)["entries"]) == 5


def test_bf16_auto_from_meta(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planning, "cpu_has_fast_bf16", lambda: True)
    run = fake_run(tmp_path, precision="bf16")
    out = evaluate_run(run, EvalConfig(lengths=[1], tokens=32), corpus=fake_corpus())
    assert out["entries"][0]["dtype"] == "bf16" and out["entries"][0]["status"] == "ok"


# ---------------------------------------------------------------------------------------------------------------
# Runs and data overrides


def test_find_runs(tmp_path: Path) -> None:
    for name in ("sweep/b", "sweep/a", "sweep/nested/c"):
        (tmp_path / name).mkdir(parents=True)
        meta = {"kind": "posenc-run", "schema_version": 1, "files": {}, "step": 0}
        (tmp_path / name / "meta.json").write_text(json.dumps(meta))
    # A checkpoint being written holds a `.pending/meta.json`: not a run of its own.
    (tmp_path / "sweep/a/.pending").mkdir()
    (tmp_path / "sweep/a/.pending/meta.json").write_text(json.dumps(meta))
    (tmp_path / "sweep/other").mkdir()
    (tmp_path / "sweep/other/meta.json").write_text(json.dumps({"kind": "something-else"}))
    runs = find_runs([tmp_path / "sweep"])
    assert [p.relative_to(tmp_path).as_posix() for p in runs] == ["sweep/a", "sweep/b", "sweep/nested/c"]
    assert find_runs([tmp_path / "sweep/a", tmp_path / "sweep/a"]) == [tmp_path / "sweep/a"]
    with pytest.raises(CheckpointError, match="no such directory"):
        find_runs([tmp_path / "missing"])
    with pytest.raises(CheckpointError, match="contains none"):
        find_runs([tmp_path / "sweep/other"])
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(CheckpointError, match="not a directory"):
        find_runs([tmp_path / "file.txt"])


def test_data_overrides() -> None:
    base = StdlibDataConfig(val_fraction=0.05)
    # files named for evaluation are scored whole: an evaluation-only corpus (held-out files, no training split)
    cfg = data_config_with_overrides(base, ["data=text", "data.paths=[a.txt,b/]"])
    assert cfg.source == "text" and cfg.paths == [] and cfg.val_paths == ["a.txt", "b/"] and cfg.val_fraction == 0.02
    assert cfg.evaluation_only
    # asking for the split explicitly keeps it (the tail training holds out, or the files it holds out)
    cfg = data_config_with_overrides(base, ["data=text", "data.paths=[a.txt]", "data.val_fraction=0.1"])
    assert cfg.paths == ["a.txt"] and cfg.val_paths == [] and not cfg.evaluation_only
    cfg = data_config_with_overrides(base, ["data=text", "data.paths=[a.txt]", "data.val_paths=[b.txt]"])
    assert cfg.paths == ["a.txt"] and cfg.val_paths == ["b.txt"]
    text_run = data_config_with_overrides(base, ["data=text", "data.paths=[train.txt]", "data.val_fraction=0.1"])
    cfg = data_config_with_overrides(text_run, ["data.paths=[held.txt]"])  # a text run's own source: whole too
    assert cfg.paths == [] and cfg.val_paths == ["held.txt"]
    assert data_config_with_overrides(text_run, ["data.val_fraction=0.3"]).paths == ["train.txt"]
    # a source without a group file composes from its registered defaults, as `train data=tasks` does
    cfg = data_config_with_overrides(base, ["data=tasks", "data.max_len=64"])
    assert cfg.source == "tasks" and cfg.max_len == 64
    cfg = data_config_with_overrides(base, ["data.val_fraction=0.1"])
    assert cfg.source == "stdlib" and cfg.val_fraction == 0.1
    with pytest.raises(ConfigError, match="data.nope"):
        data_config_with_overrides(base, ["data.nope=1"])
    with pytest.raises(ConfigError, match="only data overrides"):
        data_config_with_overrides(base, ["model=tiny"])
    with pytest.raises(ConfigError, match="available"):
        data_config_with_overrides(base, ["data=bogus"])
    with pytest.raises(ConfigError, match="data.paths"):
        data_config_with_overrides(base, ["data=text"])


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_bits_per_byte_real_tokenizers(kind: str) -> None:
    """bpb divides by the UTF-8 bytes of exactly the scored text: decode the scored span and count its bytes."""
    from posenc_cli.data.tokenizer import ByteTokenizer, train_bpe

    text = "".join(f"The cat number {i} sat on mat {i % 7}; naïve café ünïcode. " for i in range(200))
    tok = ByteTokenizer() if kind == "byte" else train_bpe([text], vocab_size=320)
    tokens = tok.encode(text)
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=32, n_layer=2, n_head=2), config_class("nope")(name="nope"), tok.vocab_size, 16)
    L, n = 16, 160
    res = evaluate_model(model.eval(), tokens, tok.token_bytes, length=L, n_tokens=n)
    assert res["tokens"] == n
    if kind == "byte":  # a byte span may cut a character in two: count raw bytes of the text
        n_bytes = len(text.encode("utf-8")[1 : n + 1])
    else:
        scored_text = tok.decode(tokens[1 : n + 1])
        assert "\ufffd" not in scored_text  # this span starts and ends on character boundaries
        n_bytes = len(scored_text.encode("utf-8"))
        assert n_bytes > 2 * n  # merges: many more bytes than tokens
    assert res["bytes"] == n_bytes
    total = sum(hand_nll(model, tokens, list(range(0, n, L)), L, L))
    assert res["bpb"] == pytest.approx(total / (math.log(2) * n_bytes), rel=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# The fixed-target protocol (NoPE paper, Kazemnejad et al. 2023, App. F)


def scored_indices(starts: np.ndarray, length: int, target: int) -> list[int]:
    """Stream indices of the tokens a window set scores: the last `target` predictions of each window."""
    return [int(s) + length - target + 1 + i for s in starts for i in range(target)]


def test_fixed_target_windows_score_the_same_tokens_at_every_length() -> None:
    n_stream, target, n_tokens = 500, 8, 40
    sets = {}
    for length in (8, 16, 50, 100):
        starts = plan_windows(n_stream, length, target, n_tokens, "fixed-target")
        assert len(starts) == 5 and (starts >= 0).all() and (starts + length + 1 <= n_stream).all()
        sets[length] = scored_indices(starts, length, target)
    assert all(s == sets[8] for s in sets.values())  # identical tokens, only the context before them grows
    assert sets[8] == list(range(n_stream - 40, n_stream))  # consecutive blocks ending at the stream's end
    assert len(plan_windows(n_stream, 4, target, n_tokens, "fixed-target")) == 0  # window shorter than target
    assert len(plan_windows(n_stream, 470, target, n_tokens, "fixed-target")) == 0  # not all windows fit
    assert resolve_stride("fixed-target", None, 64, base_length=16) == 16  # default target: the base length
    assert resolve_stride("fixed-target", 100, 64) == 100  # not capped: such a length has no window
    assert "shorter than the fixed target of 8" in no_window_reason("fixed-target", n_stream, 4, 8, n_tokens)


class KnownLoss(torch.nn.Module):
    """logits[t, v] = β·t·[v = 0] + w_v: with targets never 0, the NLL of target y at window position t is
    log(exp(β·t + w_0) + Σ_{v>0} exp(w_v)) − w_y, a function of the context length t and the token id only."""

    def __init__(self, beta: float = 0.05) -> None:
        super().__init__()
        self.beta = beta
        self.w = torch.linspace(-1.0, 1.0, V)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T = x.shape
        logits = self.w.expand(B, T, V).clone()  # (B, T, V)
        logits[:, :, 0] += self.beta * torch.arange(T, dtype=torch.float32)
        return logits

    def nll(self, t: int, y: int) -> float:
        w = self.w.double()
        rest = torch.logsumexp(w[1:], 0)
        return float(torch.logaddexp(self.beta * t + w[0], rest) - w[y])


def test_fixed_target_nll_equals_the_known_per_token_loss() -> None:
    model = KnownLoss()
    stream = byte_stream(3000) % 255 + 1  # ids 1..255: never the token the context term favours
    target, n_tokens = 16, 64
    results = {}
    for length in (16, 32, 64, 128):
        r = evaluate_model(
            model, stream, None, length=length, protocol="fixed-target", stride=target, n_tokens=n_tokens
        )
        starts = plan_windows(len(stream), length, target, n_tokens, "fixed-target")
        expected = [
            model.nll(length - target + i, int(stream[s + length - target + 1 + i]))
            for s in starts
            for i in range(target)
        ]
        assert r["tokens"] == n_tokens and r["stride"] == target and len(r["per_position"]) == target
        assert r["nll"] == pytest.approx(sum(expected) / len(expected), rel=1e-6)
        results[length] = r["nll"]
    # same scored tokens, so the token-id part is equal and the loss grows only through the context term
    assert results[16] < results[32] < results[64] < results[128]


@pytest.mark.parametrize("scheme", sorted(registry()))
def test_fixed_target_runs_for_every_scheme(tmp_path: Path, scheme: str) -> None:
    run = fake_run(tmp_path, scheme)
    cfg = EvalConfig(lengths=[0.5, 1, 2], protocol="fixed-target", target=12, tokens=24)
    out = evaluate_run(run, cfg, corpus=fake_corpus(600))
    by_len = {e["length"]: e for e in out["entries"]}
    assert all(e["protocol"] == "fixed-target" and e["stride"] == 12 for e in by_len.values())
    assert by_len[8]["status"] == "shorter_than_target" and "shorter than the fixed target" in by_len[8]["reason"]
    assert by_len[16]["status"] == "ok" and by_len[16]["tokens"] == 24 and math.isfinite(by_len[16]["nll"])
    if scheme != "learned":
        assert by_len[32]["status"] == "ok" and by_len[32]["tokens"] == 24
    # stored under its own key: the same lengths under nonoverlap are separate cells
    evaluate_run(run, EvalConfig(lengths=[1], tokens=24), corpus=fake_corpus(600))
    protocols = sorted({(e["protocol"], e["stride"]) for e in load_results(run.path)["entries"]}, key=str)
    assert protocols == [("fixed-target", 12), ("nonoverlap", None)]


def test_fixed_target_default_is_the_base_length_and_cli_checks_target(tmp_path: Path) -> None:
    from posenc_cli.cli.evaluate import build_eval_config

    run = fake_run(tmp_path)
    out = evaluate_run(run, EvalConfig(lengths=[1, 2], protocol="fixed-target", tokens=32), corpus=fake_corpus())
    assert [e["stride"] for e in out["entries"]] == [TRAIN_LEN, TRAIN_LEN]
    common = {"lengths": None, "abs_lengths": None, "stride": None, "tokens": None, "batch_tokens": None}
    cfg = build_eval_config(**common, protocol="fixed-target", target=64, dtype=None, force=False)
    assert cfg.protocol == "fixed-target" and cfg.target == 64
    with pytest.raises(ConfigError, match="--target applies to --protocol fixed-target"):
        build_eval_config(**common, protocol=None, target=64, dtype=None, force=False)
    with pytest.raises(ConfigError, match="target"):
        build_eval_config(**common, protocol="fixed-target", target=0, dtype=None, force=False)
