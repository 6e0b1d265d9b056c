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
from posenc_cli.positional.ids import random_position_ids
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


@pytest.mark.parametrize(("pos", "draw"), [("rope", "layer"), ("sinusoidal", "layer"), ("alibi", "sequence")])
def test_training_ids_are_sorted_subsets_of_M_and_evaluation_uses_arange(
    pos: str, draw: str, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record(monkeypatch)
    cfg = tiny_config(corpus, pos=pos, steps=3, eval_every=3, random_positions=M, random_positions_draw=draw)
    res = train(cfg, tmp_path / "run")
    assert res.stopped_reason == "complete"
    trained = [ids for training, ids in seen if training]
    assert len(trained) == 3
    for ids in trained:  # per layer: (B, n_layer, T), each layer of each row its own draw
        assert ids is not None and ids.shape == ((4, 2, T) if draw == "layer" else (4, T))
        assert bool((ids.diff(dim=-1) > 0).all()) and int(ids.min()) >= 0 and int(ids.max()) < M
        if draw == "layer":
            assert not torch.equal(ids[:, 0], ids[:, 1])
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
    for ids in fed:  # per layer, as trained: (B, n_layer, T)
        assert ids is not None and ids.dim() == 3 and ids.shape[1] == 2
        assert bool((ids.diff(dim=-1) > 0).all()) and int(ids.max()) < M
    assert max(int(ids.max()) for ids in fed if ids is not None) >= 2 * T
    entries = json.loads(out_json.read_text())["runs"][0]["entries"]
    assert [e["status"] for e in entries] == ["ok", "ok", "n/a"]  # 128 distinct ids do not fit in [0, 96)
    assert "train.random_positions=96" in entries[2]["reason"]
    assert all(e["positions"] == {"mode": "random", "range": M, "seed": 0, "layers": 2} for e in entries)
    assert f"sorted random draws from [0, {M})" in result.stdout

    seen.clear()
    result = CliRunner().invoke(app, [*args, "--positions", "sequential"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "reused" not in result.stdout and seen and all(ids is None for _, ids in seen)  # its own cells


def rope_model(n_layer: int = 2) -> GPT:
    from posenc_cli.config import ModelConfig
    from posenc_cli.positional import config_class

    torch.manual_seed(0)
    return GPT(ModelConfig(d_model=32, n_layer=n_layer, n_head=2), config_class("rope")(), 48, T).eval()


def test_each_layer_reads_its_own_ids() -> None:
    """(B, n_layer, T) ids: equal layers give the shared-ids forward; layer i's ids change layer i only."""
    model, g = rope_model(), torch.Generator().manual_seed(0)
    idx = torch.randint(0, 48, (2, T), generator=g)
    a, b = (random_position_ids(2, T, M, g) for _ in range(2))  # (B, T) each
    with torch.no_grad():
        shared = model(idx, position_ids=a)
        torch.testing.assert_close(model(idx, position_ids=torch.stack([a, a], 1)), shared, rtol=0, atol=0)
        mixed = model(idx, position_ids=torch.stack([a, b], 1))
        assert not torch.allclose(mixed, shared, atol=1e-4)
        assert not torch.allclose(mixed, model(idx, position_ids=b), atol=1e-4)
        # layer 0's ids alone decide the first layer: feeding b to layer 0 instead changes the output again
        assert not torch.allclose(model(idx, position_ids=torch.stack([b, a], 1)), mixed, atol=1e-4)
    with pytest.raises(ValueError, match=r"need \(B, 2, T\)"):
        model(idx, position_ids=torch.stack([a, a, a], 1))


def test_per_layer_ids_decode_through_the_cache_as_the_full_forward() -> None:
    model, g = rope_model(), torch.Generator().manual_seed(1)
    idx = torch.randint(0, 48, (2, 3 * T), generator=g)
    ids = random_position_ids(2, 3 * T, M, g, layers=2)  # (B, n_layer, 3T)
    assert ids.shape == (2, 2, 3 * T) and bool((ids.diff(dim=-1) > 0).all())
    with torch.no_grad():
        full = model(idx, position_ids=ids)
        cache = model.new_cache()
        parts = [model(idx[:, :T], cache=cache, position_ids=ids[..., :T])]
        parts += [model(idx[:, t : t + 1], cache=cache, position_ids=ids[..., t : t + 1]) for t in range(T, 3 * T)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=0)


def test_a_run_saved_before_the_draw_setting_keeps_one_draw_per_sequence(corpus: Path) -> None:
    from posenc_cli.config import config_to_dict
    from posenc_cli.evaluation.positions import draw_layers, trained_positions
    from posenc_cli.run.config_load import config_from_dict

    raw = config_to_dict(tiny_config(corpus, pos="rope", random_positions=M))
    assert raw["train"]["random_positions_draw"] == "layer" and draw_layers(config_from_dict(raw)) == 2
    del raw["train"]["random_positions_draw"]
    old = config_from_dict(raw, saved=True)
    assert old.train.random_positions_draw == "sequence" and draw_layers(old) == 0
    assert trained_positions(old).to_json() == {"mode": "random", "range": M, "seed": 0}  # its cells' key unchanged
