"""`posenc train` through Typer's CliRunner: config printing, errors, a full tiny run, completion, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from train_utils import nan_loss_at, tiny_overrides, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app

runner = CliRunner()


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path)


def test_cfg_job_prints_the_resolved_config_without_training(tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "pos=alibi", "train.steps=123", "--cfg", "job", "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    cfg = yaml.safe_load(result.stdout)
    assert cfg["pos"]["name"] == "alibi" and cfg["train"]["steps"] == 123
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("extra", [[], ["--cfg", "job"]])
def test_bad_override_exits_2_with_one_line(extra: list[str]) -> None:
    result = runner.invoke(app, ["train", "model.n_layr=3", *extra])
    assert result.exit_code == 2
    assert "unknown config key 'model.n_layr'" in result.stderr
    bad_type = runner.invoke(app, ["train", "train.steps=abc", *extra])
    assert bad_type.exit_code == 2 and "train.steps" in bad_type.stderr


def test_train_prints_lines_and_a_summary_then_says_complete(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["train", *tiny_overrides(corpus, steps=6, log_every=3, eval_every=3), "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "step 3/6 | loss" in result.stdout and "step 6/6 | loss" in result.stdout  # plain lines: not a tty
    assert "step 3: val loss" in result.stdout
    assert "training summary" in result.stdout and "perplexity" in result.stdout and str(out) in result.stdout
    assert json.loads((out / "meta.json").read_text())["status"] == "complete"
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "already complete" in again.stdout


def test_changed_config_is_refused_and_force_config_continues(corpus: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "run")
    assert runner.invoke(app, ["train", *tiny_overrides(corpus, steps=4), "--out", out]).exit_code == 0
    refused = runner.invoke(app, ["train", *tiny_overrides(corpus, steps=4, lr=0.01), "--out", out])
    assert refused.exit_code == 2 and "different config (train.lr: 0.003 -> 0.01)" in refused.stderr
    more = runner.invoke(app, ["train", "--resume", out, "train.steps=6", "--force-config"])
    assert more.exit_code == 0, more.output
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["step"] == 6


def test_resume_errors(tmp_path: Path) -> None:
    missing = runner.invoke(app, ["train", "--resume", str(tmp_path)])
    assert missing.exit_code == 2 and "is not a posenc run directory" in missing.stderr
    group = runner.invoke(app, ["train", "--resume", str(tmp_path), "model=small"])
    assert group.exit_code == 2 and "overrides must set single keys" in group.stderr
    both = runner.invoke(app, ["train", "--resume", str(tmp_path / "a"), "--out", str(tmp_path / "b")])
    assert both.exit_code == 2 and "different directories" in both.stderr


def test_nan_exits_nonzero_naming_the_step(corpus: Path, tmp_path: Path) -> None:
    with nan_loss_at(3):
        result = runner.invoke(app, ["train", *tiny_overrides(corpus, steps=6), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "non-finite loss (nan) at step 3" in result.stderr


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("train.batch_size=1000000000", "train.batch_size=1000000000 × train.seq_len=16"),
        ("train.eval_batches=1000000000000", "train.eval_batches=1000000000000 validation batches"),
        ("train.grad_accum=1000000000000", "train.grad_accum=1000000000000 micro-batches"),
    ],
)
def test_impossible_budget_exits_2_with_one_line_and_writes_nothing(
    corpus: Path, tmp_path: Path, override: str, names: str
) -> None:
    out = tmp_path / "runs" / "r"
    result = runner.invoke(app, ["train", *tiny_overrides(corpus), override, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and names in result.stderr  # the refusal alone, before any advice
    assert "Traceback" not in result.output and result.stdout == ""
    assert not (tmp_path / "runs").exists()


def test_a_run_refused_after_claiming_leaves_no_directory(tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = runner.invoke(app, ["train", *tiny_overrides(tmp_path / "missing.txt"), "--out", str(out)])
    assert result.exit_code == 2 and "missing.txt" in result.stderr
    assert not out.exists()
