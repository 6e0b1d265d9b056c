"""eval-extrapolate of a run trained with randomized positions (Ruoss et al. 2023) feeds the ids it trained on:
per window a sorted draw from [0, M), seeded; sequential 0..T-1 on request; each mode its own cell."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from posenc_cli.config import Config, EvalConfig, ModelConfig, TrainConfig
from posenc_cli.errors import ConfigError
from posenc_cli.evaluation.perplexity.measuring import evaluate_model
from posenc_cli.evaluation.positions import Positions, resolve_positions
from posenc_cli.evaluation.results import load_results, positions_key
from posenc_cli.evaluation.tasks.extrapolate import evaluate_run
from posenc_cli.model import GPT
from posenc_cli.positional import config_class
from posenc_cli.run.meta import RunMeta

V, T, M = 257, 16, 64
BYTES = np.array([1] * 256 + [0], dtype=np.int64)


def run_with(tmp_path: Path, random_positions: int, name: str = "run") -> SimpleNamespace:
    path = tmp_path / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "meta.json").write_text(json.dumps({"kind": "posenc-run", "train_length": T}))
    cfg = Config(
        model=ModelConfig(d_model=32, n_layer=1, n_head=2),
        pos=config_class("rope")(name="rope"),
        train=TrainConfig(seq_len=T, random_positions=random_positions),
    )
    torch.manual_seed(0)
    model = GPT(cfg.model, cfg.pos, V, T).eval()
    meta = RunMeta(step=0, train_length=T, base_length=T)
    tok = SimpleNamespace(token_bytes=BYTES, fingerprint="byte")
    return SimpleNamespace(path=path, model=model, config=cfg, meta=meta, tokenizer=tok, scheme_label=cfg.pos.name)


def corpus(n: int = 3000) -> SimpleNamespace:
    ids = (np.arange(n) * 7919 % 251).astype(np.int32)
    return SimpleNamespace(val=ids, info={"fingerprint": "fp"})


def spy(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor | None]:
    seen: list[torch.Tensor | None] = []
    forward = GPT.forward

    def recording(self: GPT, idx: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        ids = kwargs.get("position_ids")
        seen.append(None if ids is None else ids.detach().cpu().clone())
        return forward(self, idx, **kwargs)

    monkeypatch.setattr(GPT, "forward", recording)
    return seen


def test_random_position_run_is_fed_sorted_draws_from_its_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = spy(monkeypatch)
    out = evaluate_run(run_with(tmp_path, M), EvalConfig(abs_lengths=[16, 32], tokens=96), corpus=corpus())
    assert seen and all(ids is not None for ids in seen)
    rows = [r for ids in seen if ids is not None for r in ids.reshape(-1, ids.shape[-1])]  # (T,) per window (one layer)
    # 6 windows of 16 and 3 of 32 (no LongPPL: it is measured only when an evaluator is named)
    assert sorted({len(r) for r in rows}) == [16, 32] and len(rows) == 96 // 16 + 96 // 32
    for r in rows:
        assert bool((r.diff() > 0).all()) and int(r.min()) >= 0 and int(r.max()) < M
    assert max(int(r.max()) for r in rows) >= 32  # not 0..T-1
    assert len({tuple(r.tolist()) for r in rows}) == len(rows)  # a fresh draw per window
    for e in out["entries"]:
        assert e["status"] == "ok" and e["positions"] == {"mode": "random", "range": M, "seed": 0, "layers": 1}


def test_draws_are_seeded_and_independent_of_batching(tmp_path: Path) -> None:
    run = run_with(tmp_path, M)
    kwargs = {"length": 16, "n_tokens": 128, "positions": Positions("random", M, 3)}
    a = evaluate_model(run.model, corpus().val, BYTES, batch_tokens=16, **kwargs)
    b = evaluate_model(run.model, corpus().val, BYTES, batch_tokens=10_000, **kwargs)
    assert a["nll"] == pytest.approx(b["nll"], rel=1e-6)
    other = evaluate_model(run.model, corpus().val, BYTES, **{**kwargs, "positions": Positions("random", M, 4)})
    sequential = evaluate_model(run.model, corpus().val, BYTES, **{**kwargs, "positions": None})
    assert other["nll"] != pytest.approx(a["nll"], rel=1e-9) and sequential["nll"] != pytest.approx(a["nll"], rel=1e-9)


def test_modes_are_separate_cells_and_lengths_beyond_M_are_na(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_with(tmp_path, M)
    cfg = EvalConfig(abs_lengths=[16, 128], tokens=32)
    out = evaluate_run(run, cfg, corpus=corpus())
    beyond = out["entries"][1]
    assert beyond["status"] == "n/a" and "train.random_positions=64" in beyond["reason"] and beyond["ppl"] is None
    seen = spy(monkeypatch)
    sequential = evaluate_run(run, cfg, corpus=corpus(), positions="sequential")
    assert sequential["reused"] == 0 and seen and all(ids is None for ids in seen)  # measured, fed 0..T-1
    assert [e["status"] for e in sequential["entries"]] == ["ok", "ok"]  # 128 tokens of RoPE: readable
    seeded = evaluate_run(run, cfg, corpus=corpus(), positions_seed=1)
    assert seeded["reused"] == 0
    stored = load_results(run.path)["entries"]
    assert sorted({positions_key(e) for e in stored}, key=str) == [
        ("random", M, 0),
        ("random", M, 1),
        ("sequential", None, None),
    ]
    seen.clear()
    again = evaluate_run(run, cfg, corpus=corpus(), positions="sequential")
    assert again["reused"] == 2 and not seen  # its own cells, reused


def test_choosing_positions() -> None:
    assert resolve_positions(None, 0) == Positions()
    assert resolve_positions(None, M, 5) == Positions("random", M, 5)
    assert resolve_positions("sequential", M) == Positions()
    with pytest.raises(ConfigError, match="not trained with randomized positions"):
        resolve_positions("random", 0, run="runs/rope")
    with pytest.raises(ConfigError, match="random or sequential"):
        resolve_positions("shuffled", M)


def test_sequential_run_and_streaming_keep_their_positions(tmp_path: Path) -> None:
    out = evaluate_run(run_with(tmp_path, 0, "plain"), EvalConfig(abs_lengths=[16], tokens=32), corpus=corpus())
    assert out["entries"][0]["positions"] == {"mode": "sequential"}
    with pytest.raises(ConfigError, match="not trained with randomized"):
        evaluate_run(run_with(tmp_path, 0, "p"), EvalConfig(abs_lengths=[16]), corpus=corpus(), positions="random")
    streaming = EvalConfig(abs_lengths=[32], tokens=32, protocol="streaming")
    out = evaluate_run(run_with(tmp_path, M, "rand"), streaming, corpus=corpus())
    assert out["entries"][0]["positions"] == {"mode": "sequential"}  # the cache's own positions
    with pytest.raises(ConfigError, match="does not apply to --protocol streaming"):
        evaluate_run(run_with(tmp_path, M, "rand"), streaming, corpus=corpus(), positions="random")
