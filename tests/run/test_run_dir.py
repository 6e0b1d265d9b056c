"""run_dir and outcome: config comparison, run names, what a run directory holds, results rebuilt from meta.json."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from train_utils import tiny_config, write_corpus

from posenc_cli.config import ModelConfig, replace
from posenc_cli.errors import CheckpointError
from posenc_cli.run.outcome import result_from_meta
from posenc_cli.run.run_dir import config_diff, default_run_dir, existing_meta, model_preset_name


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path)


def test_config_diff_ignores_runtime_keys(corpus: Path) -> None:
    a = tiny_config(corpus)
    assert config_diff(a, tiny_config(corpus, threads=2, log_every=7, device="auto", compile=True)) == []
    diffs = config_diff(a, tiny_config(corpus, lr=1e-4))
    assert diffs == ["train.lr: 0.003 -> 0.0001"]
    assert any(d.startswith("pos.") for d in config_diff(a, tiny_config(corpus, pos="alibi")))


def test_run_dir_name_uses_preset(corpus: Path, tmp_path: Path) -> None:
    cfg = tiny_config(corpus)
    assert model_preset_name(cfg) == "d32l2"
    assert model_preset_name(replace(cfg, model=ModelConfig())) == "tiny"
    path = default_run_dir(cfg, root=tmp_path)
    assert path.parent == tmp_path and path.name.endswith("-nope-d32l2")
    path.mkdir()
    assert default_run_dir(cfg, root=tmp_path) != path  # a taken name gets a suffix


def test_existing_meta_of_new_and_foreign_paths(tmp_path: Path) -> None:
    assert existing_meta(tmp_path / "new") is None  # not there yet: a new run
    (tmp_path / "empty").mkdir()
    assert existing_meta(tmp_path / "empty") is None  # an empty directory is fine too
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="exists and is not a directory"):
        existing_meta(tmp_path / "file")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.yaml").write_text("lr: 1\n")
    with pytest.raises(CheckpointError, match="not a posenc run directory but holds config.yaml"):
        existing_meta(tmp_path / "other")


def test_result_from_meta_reports_an_already_complete_run(tmp_path: Path) -> None:
    meta = {"step": 20, "steps": 20, "tokens": 1280, "val_loss": 2.0, "best_val_loss": 1.9, "precision": "fp32"}
    result = result_from_meta(tmp_path, meta)
    assert result.stopped_reason == "already_complete" and (result.step, result.steps) == (20, 20)
    assert result.val_ppl == pytest.approx(math.exp(2.0))  # perplexity = exp(mean nats/token)
    assert result.tokens_per_s == 0.0 and result.signal is None
    assert result_from_meta(tmp_path, {"step": 3, "val_loss": 800.0}).val_ppl is None  # exp would overflow
