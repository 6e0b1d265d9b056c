"""Randomized positions (Ruoss et al. 2023): `train.random_positions=M` trains on sorted random subsets of [0, M)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from train_utils import tiny_config, write_corpus

from posenc_cli.config import replace
from posenc_cli.errors import ConfigError
from posenc_cli.model import GPT
from posenc_cli.run.load import load_run
from posenc_cli.run.train import train

T, M = 16, 96


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("randpos"))


def record(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, torch.Tensor | None]]:
    """(training?, position ids) of every forward."""
    seen: list[tuple[bool, torch.Tensor | None]] = []
    forward = GPT.forward

    def spy(self: GPT, idx: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        ids = kwargs.get("position_ids")
        seen.append((self.training, None if ids is None else ids.detach().cpu().clone()))
        return forward(self, idx, **kwargs)

    monkeypatch.setattr(GPT, "forward", spy)
    return seen


@pytest.mark.parametrize("pos", ["rope", "sinusoidal", "alibi"])
def test_training_ids_are_sorted_subsets_of_M_and_evaluation_uses_arange(
    pos: str, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record(monkeypatch)
    res = train(tiny_config(corpus, pos=pos, steps=3, eval_every=3, random_positions=M), tmp_path / "run")
    assert res.stopped_reason == "complete"
    trained = [ids for training, ids in seen if training]
    assert len(trained) == 3
    for ids in trained:
        assert ids is not None and ids.shape == (4, T)
        assert bool((ids.diff(dim=1) > 0).all()) and int(ids.min()) >= 0 and int(ids.max()) < M
    assert max(int(ids.max()) for ids in trained if ids is not None) > 2 * T  # beyond 0..T−1
    assert all(ids is None for training, ids in seen if not training)  # validation: the default 0..T−1
    assert load_run(tmp_path / "run").config.train.random_positions == M


def test_learned_positions_need_a_table_of_M(corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tiny_config(corpus, pos="learned", steps=2, random_positions=M)
    with pytest.raises(ConfigError, match=f"random_positions={M}.*at most {T} positions; set pos.table_size={M}"):
        train(cfg, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()  # nothing written

    cfg = replace(cfg, pos=replace(cfg.pos, table_size=M))
    train(cfg, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.model.scheme.max_length == M and run.model.scheme.wpe.weight.shape[0] == M  # type: ignore[union-attr]
    logits = run.model(torch.zeros(1, 4 * T, dtype=torch.long))  # 4x the training length: inside the table
    assert logits.shape == (1, 4 * T, run.model.vocab_size) and bool(torch.isfinite(logits).all())


def test_random_positions_are_deterministic_and_resume_exactly(corpus: Path, tmp_path: Path) -> None:
    cfg = tiny_config(corpus, pos="rope", steps=4, save_every=2, random_positions=M)
    train(cfg, tmp_path / "a")
    train(replace(cfg, train=replace(cfg.train, steps=2)), tmp_path / "b")
    train(cfg, tmp_path / "b", force_config=True)  # continue 2 -> 4
    wa, wb = load_run(tmp_path / "a").model.state_dict(), load_run(tmp_path / "b").model.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize(
    ("train_fields", "match"),
    [
        ({"random_positions": 8}, "must be 0 \\(off\\) or >= train.seq_len"),
        ({"random_positions": -1}, "must be >= 0"),
        ({"random_positions": 64, "pose_length": 64}, "exclude each other"),
        ({"pose_length": 64, "pose_chunks": 17}, "pose_chunks=17"),
    ],
)
def test_bad_settings_are_refused(corpus: Path, train_fields: dict[str, int], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        tiny_config(corpus, pos="rope", **train_fields).validate()


def test_eval_extrapolate_feeds_the_trained_position_range(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """posenc evaluated a train.random_positions=M run with ids 0..T-1, a distribution it never trained on."""
    import json

    from typer.testing import CliRunner

    from posenc_cli.cli import app

    train(tiny_config(corpus, pos="rope", steps=2, random_positions=M), tmp_path / "run")
    seen = record(monkeypatch)
    out_json = tmp_path / "e.json"
    args = ["eval-extrapolate", str(tmp_path / "run"), "--abs-lengths", "16,32,128", "--tokens", "64"]
    result = CliRunner().invoke(app, [*args, "--json", str(out_json)], terminal_width=200)
    assert result.exit_code == 0, result.output
    fed = [ids for _, ids in seen]
    assert fed and all(ids is not None for ids in fed)
    for ids in fed:
        assert ids is not None and bool((ids.diff(dim=1) > 0).all()) and int(ids.max()) < M
    assert max(int(ids.max()) for ids in fed if ids is not None) >= 2 * T
    entries = json.loads(out_json.read_text())["runs"][0]["entries"]
    assert [e["status"] for e in entries] == ["ok", "ok", "n/a"]  # 128 distinct ids do not fit in [0, 96)
    assert "train.random_positions=96" in entries[2]["reason"]
    assert all(e["positions"] == {"mode": "random", "range": M, "seed": 0} for e in entries)
    assert f"sorted random draws from [0, {M})" in result.stdout

    seen.clear()
    result = CliRunner().invoke(app, [*args, "--positions", "sequential"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "reused" not in result.stdout and seen and all(ids is None for _, ids in seen)  # its own cells
