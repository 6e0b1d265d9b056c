"""End to end: train a tiny model on data=tasks for a few steps, then `posenc eval-tasks` from the CLI (table, JSON,
heatmap, scores in [0, 1], cells cached on the second call, n/a for learned positions beyond their table, the scoring
in the cell key and the caption); hostile flags are one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc_cli.cli import app

runner = CliRunner()
TINY = ["model=tiny", "model.d_model=32", "model.n_layer=1", "model.n_head=2", "train.seq_len=256"]


def test_train_on_tasks_then_eval_tasks(tmp_path: Path) -> None:
    run = tmp_path / "run"
    data = ["data=tasks", "data.episodes=200", "train.steps=3", "train.batch_size=2", "train.eval_every=100"]
    data += ["data.tokens_to_generate=48"]  # eval-tasks' budget on this run: 256 bytes hold RULER's sizes and 48
    trained = runner.invoke(app, ["train", *TINY, *data, "pos=learned", "--out", str(run)])
    assert trained.exit_code == 0, trained.output
    args = [str(run), "--tasks", "niah-multikey,variable-tracking", "--lengths", "1,2", "--depths", "0,0.5,1"]
    args += ["--trials", "2", "--device", "cpu"]
    out_json, plot = tmp_path / "all.json", tmp_path / "tasks.png"
    first = runner.invoke(app, ["eval-tasks", *args, "--json", str(out_json), "--plot", str(plot)], terminal_width=200)
    assert first.exit_code == 0, first.output
    assert "niah-multikey · RULER score" in first.output and "variable-tracking · RULER score" in first.output
    assert "supports at most 256 positions" in first.output  # learned: n/a at 2x with the reason
    assert "contained (case-insensitive) in 48 generated tokens" in first.output  # the scoring, in the caption
    entries = json.loads(out_json.read_text())["runs"][0]["entries"]
    assert len(entries) == 2 * 2 * 3
    ok = [e for e in entries if e["status"] == "ok"]
    assert {e["length"] for e in ok} == {256} and all(0.0 <= e["score"] <= 1.0 for e in ok)
    assert {(e["scoring"], e["generate"]) for e in entries} == {("contains", 48)}
    assert {json.dumps(e["sizes"]) for e in entries} == {
        '{"keys": 4, "digits": 7}',
        '{"hops": 4, "vt_digits": 5, "letters": 5}',
    }
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

    # posenc's exact scoring is another cell: measured, not reused, and named in the title and caption
    exact = runner.invoke(app, ["eval-tasks", *args, "--scoring", "exact"], terminal_width=200)
    assert exact.exit_code == 0 and "cells reused" not in exact.output, exact.output
    assert (
        "niah-multikey · exact score" in exact.output
        and "Exact score (posenc's, stricter than RULER's)" in " ".join(exact.output.split())
    ), exact.output
    stored = json.loads((run / "eval" / "tasks.json").read_text())
    assert len(stored["entries"]) == 24
    both = runner.invoke(app, ["compare", str(run)], terminal_width=200)  # one table per scoring, never mixed
    assert "niah-multikey · RULER score, mean over depths" in both.output
    assert "niah-multikey · exact score, mean over depths" in both.output

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


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--trials", "1000000000"],
            "--trials must be in [1, 1000000], got 1000000000",
        ),  # 7.2 GB before; now refused up front
        (["--seed", "-1"], "--seed must be in [0, 9223372036854775807], got -1"),
        (["--scoring", "fuzzy"], "--scoring must be contains or exact"),
        (["--tokens-to-generate", "0"], "--tokens-to-generate must be in [1, 65536], got 0"),
        (["--sizes", "keys=100"], "--sizes keys must be at most 40"),
        (["--sizes", "hops"], "expected name=integer pairs"),
        (["--sizes", "colours=2"], "unknown size 'colours'"),
        (["--sizes", "common_freq=1"], "common_freq (1) must exceed uncommon_freq (1)"),
        (["--threshold", "85.6"], "--threshold must be a score in [0, 1], got 85.6"),
    ],
)
def test_hostile_flags_are_one_line_and_write_nothing(tmp_path: Path, flags: list[str], message: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    result = runner.invoke(app, ["eval-tasks", str(run), *flags], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert list(tmp_path.rglob("*")) == [run]


def test_eval_tasks_scores_cwe_fwe_and_kv_with_effective_length(tmp_path: Path) -> None:
    """The aggregation tasks and key-value retrieval from the CLI on a tiny rope model: CWE and FWE one cell per
    length (no depth), KV one per depth; a length too short for a task is n/a with what it needs; the effective
    length follows --threshold."""
    run = tmp_path / "run"
    data = ["data=tasks", "data.episodes=200", "data.min_len=200", "data.max_len=300", "train.steps=2"]
    data += ["data.tasks=[kv-retrieval]"]
    data += ["train.batch_size=2", "train.eval_every=100", "pos=rope"]
    trained = runner.invoke(app, ["train", *TINY, *data, "--out", str(run)])
    assert trained.exit_code == 0, trained.output
    args = [str(run), "--tasks", "common-words,frequent-words,kv-retrieval", "--abs-lengths", "256,1024"]
    args += ["--depths", "0,0.5,1", "--trials", "2", "--device", "cpu", "--json", str(tmp_path / "t.json")]
    result = runner.invoke(app, ["eval-tasks", *args, "--threshold", "0"], terminal_width=250)
    assert result.exit_code == 0, result.output
    entries = json.loads((tmp_path / "t.json").read_text())["runs"][0]["entries"]
    cells = {(e["task"], e["length"], e["depth"]): e for e in entries}
    assert len(entries) == len(cells) == 2 + 2 + 2 * 3
    assert {d for t, _, d in cells if t != "kv-retrieval"} == {None}  # RULER's CWE and FWE have no depth
    for task in ("common-words", "frequent-words"):  # 256 tokens hold neither (byte tokens), 1024 both
        assert cells[task, 256, None]["status"] == "n/a" and "shorter than the smallest prompt" in str(
            cells[task, 256, None]["reason"]
        )
        assert cells[task, 1024, None]["status"] == "ok"
    assert {(e["task"], e["generate"]) for e in entries} == {
        ("common-words", 120),
        ("frequent-words", 50),
        ("kv-retrieval", 128),
    }
    ok = [e for e in entries if e["status"] == "ok"]
    assert len(ok) == 2 + 6 and all(0.0 <= e["score"] <= 1.0 and e["samples"] for e in ok)
    assert cells["common-words", 1024, None]["sizes"] == {"common": 10, "common_freq": 6, "uncommon_freq": 1}
    text = " ".join(result.output.split())
    assert "common-words · RULER score" in text and "kv-retrieval · RULER score" in text
    assert "effective (≥ 0%)" in text and "≥ 1024" in text  # every measured length passes a 0 threshold
    assert "n/a for run (rope) at 256: length 256 is shorter than the smallest prompt" in text

    strict = runner.invoke(app, ["eval-tasks", *args[:-2], "--threshold", "1.0"], terminal_width=250)
    assert strict.exit_code == 0 and "10 of 10 cells reused" in strict.output  # a report setting, not a cell's
    kv = json.loads((tmp_path / "t.json").read_text())["runs"][0]["entries"]
    scores = [e["score"] for e in kv if e["task"] == "kv-retrieval" and e["length"] == 256]
    assert ("none" in strict.output) == (sum(scores) / len(scores) < 1.0)
