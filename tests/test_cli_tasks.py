"""End to end: train a tiny model on data=tasks for a few steps, then `posenc eval-tasks` from the CLI (table, JSON,
heatmap, scores in [0, 1], cells cached on the second call, n/a for learned positions beyond their table)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from posenc_cli.cli import app

runner = CliRunner()
TINY = ["model=tiny", "model.d_model=32", "model.n_layer=1", "model.n_head=2", "train.seq_len=128"]


def test_train_on_tasks_then_eval_tasks(tmp_path: Path) -> None:
    run = tmp_path / "run"
    data = ["data=tasks", "data.episodes=200", "train.steps=3", "train.batch_size=2", "train.eval_every=100"]
    trained = runner.invoke(app, ["train", *TINY, *data, "pos=learned", "--out", str(run)])
    assert trained.exit_code == 0, trained.output
    args = [str(run), "--tasks", "niah-multikey,variable-tracking", "--lengths", "1,2", "--depths", "0,0.5,1"]
    args += ["--trials", "2", "--device", "cpu"]
    out_json, plot = tmp_path / "all.json", tmp_path / "tasks.png"
    first = runner.invoke(app, ["eval-tasks", *args, "--json", str(out_json), "--plot", str(plot)], terminal_width=200)
    assert first.exit_code == 0, first.output
    assert "niah-multikey · RULER score" in first.output and "variable-tracking · RULER score" in first.output
    assert "supports at most 128 positions" in first.output  # learned: n/a at 2x with the reason
    entries = json.loads(out_json.read_text())["runs"][0]["entries"]
    assert len(entries) == 2 * 2 * 3
    ok = [e for e in entries if e["status"] == "ok"]
    assert {e["length"] for e in ok} == {128} and all(0.0 <= e["score"] <= 1.0 for e in ok)
    assert plot.stat().st_size > 0
    stored = json.loads((run / "eval" / "tasks.json").read_text())
    assert len(stored["entries"]) == 12
    again = runner.invoke(app, ["eval-tasks", *args], terminal_width=200)
    assert again.exit_code == 0 and "12 of 12 cells reused" in again.output
    compared = runner.invoke(app, ["compare", str(run)], terminal_width=200)  # the sweep's end uses the same hook
    assert compared.exit_code == 0, compared.output
    assert "niah-multikey · RULER score, mean over depths" in compared.output
    assert "variable-tracking · RULER score, mean over depths" in compared.output
    assert "n/a" in compared.output  # learned positions at 2x

    # Cells measured with another prompt text (generator version 1, before the answer prefix) are never reused
    # or shown: they are measured again.
    stored["entries"] = [{**e, "generator": 1} for e in stored["entries"]]
    (run / "eval" / "tasks.json").write_text(json.dumps(stored))
    hidden = runner.invoke(app, ["compare", str(run)], terminal_width=200)
    assert "niah-multikey · RULER score" not in hidden.output
    remeasured = runner.invoke(app, ["eval-tasks", *args], terminal_width=200)
    assert remeasured.exit_code == 0 and "cells reused" not in remeasured.output


def test_unknown_task_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["eval-tasks", str(tmp_path), "--tasks", "niah-nope"])
    assert result.exit_code == 2 and "unknown task 'niah-nope'" in result.output
