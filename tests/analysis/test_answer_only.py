"""A run trained on answer tokens only (`train.loss_on=answer`) has no perplexity by construction: eval-extrapolate
refuses it in one line, a sweep job skips it, and `compare` leaves it out of the perplexity table with one line
saying why, while its task scores are still gathered (the answer-only runs of the tasks and algorithmic sweeps
printed perplexities in the millions before)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc_cli.analysis.compare import Comparison, label_list
from posenc_cli.analysis.gather import gather
from posenc_cli.analysis.rows import ANSWER_ONLY
from posenc_cli.cli import app
from posenc_cli.evaluation.tasks.extrapolate import ExtrapolateTask
from posenc_cli.run.config_compose import compose_config
from posenc_cli.run.load import load_run

runner = CliRunner()
TINY = ["model=tiny", "model.d_model=16", "model.n_layer=1", "model.n_head=2", "train.seq_len=32"]
DATA = ["data=algorithmic", "data.tasks=[copy]", "data.examples=200", "data.max_length=4"]
STEPS = ["train.steps=1", "train.batch_size=2", "train.threads=1", "train.packing=none"]


def train(path: Path, loss_on: str) -> Path:
    trained = runner.invoke(app, ["train", *TINY, *DATA, *STEPS, f"train.loss_on={loss_on}", "--out", str(path)])
    assert trained.exit_code == 0, trained.output
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("answer-only")
    return train(root / "answer", "answer"), train(root / "all", "all")


def test_eval_extrapolate_refuses_an_answer_only_run_in_one_line(runs: tuple[Path, Path]) -> None:
    answer, every = runs
    refused = runner.invoke(app, ["eval-extrapolate", str(answer), "--lengths", "1"])
    assert refused.exit_code == 2, refused.output
    assert "train.loss_on=answer" in refused.output and "Traceback" not in refused.output
    assert not (answer / "eval" / "extrapolate.json").exists()
    measured = runner.invoke(app, ["eval-extrapolate", str(every), "--lengths", "1"])
    assert measured.exit_code == 0, measured.output
    searched = runner.invoke(app, ["eval-extrapolate", str(answer.parent), "--lengths", "1"])  # found, not named
    assert searched.exit_code == 2 and str(answer) in searched.output, searched.output


def test_a_sweep_job_trained_on_answers_has_no_perplexity_task(runs: tuple[Path, Path]) -> None:
    answer, every = runs
    job = compose_config([*TINY, *DATA, *STEPS, "train.loss_on=answer"])
    assert ExtrapolateTask.for_job(load_run(answer), job, device="cpu") is None
    other = compose_config([*TINY, *DATA, *STEPS, "train.loss_on=all"])
    assert ExtrapolateTask.for_job(load_run(every), other, device="cpu") is not None


def test_compare_leaves_answer_only_runs_out_of_the_perplexity_table(runs: tuple[Path, Path]) -> None:
    answer, every = runs
    runner.invoke(app, ["eval-extrapolate", str(every), "--lengths", "1"])
    stale = {"schema_version": 1, "run": "answer", "scheme": "rope", "entries": [{"length": 32, "ppl": 1e6}]}
    (answer / "eval").mkdir(exist_ok=True)
    (answer / "eval" / "extrapolate.json").write_text(json.dumps(stale))  # as the sweeps stored before
    records = gather([answer, every])
    assert [r.status for r in records if r.run_dir == answer] == [ANSWER_ONLY]
    comparison = Comparison(records)
    _, rows, _ = comparison.table
    assert [row.label for row in rows] == ["all (rope)"]
    assert any("No perplexity for answer (rope)" in line and "loss_on=answer" in line for line in comparison.caption)
    shown = runner.invoke(app, ["compare", str(answer), str(every)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "1e+06" not in shown.output and "1,000,000" not in shown.output


def test_compare_of_answer_only_runs_alone_prints_no_empty_table(runs: tuple[Path, Path]) -> None:
    answer, _ = runs
    shown = runner.invoke(app, ["compare", str(answer)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "No perplexity for" in shown.output and "by evaluation length" not in shown.output


def test_caption_keeps_labels_with_commas_apart() -> None:
    assert label_list(["rope", "alibi"]) == "rope, alibi"
    assert label_list(["path, lr=0.0003", "path, lr=0.001"]) == "path, lr=0.0003; path, lr=0.001"
