"""`posenc bench --eval-lengths`: the cost curve's tables and files, and its errors (one line, exit 2, nothing
measured or written)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc_cli.cli import app

runner = CliRunner()
TINY = ["model.d_model=32", "model.n_layer=1", "model.n_head=2", "train.seq_len=16", "train.threads=1"]
TINY += ["train.device=cpu", "train.precision=fp32"]


@pytest.mark.integration  # end to end
def test_curve_prints_both_tables_and_writes_json_csv_and_plot(tmp_path: Path) -> None:
    out = {name: tmp_path / "out" / name for name in ("curve.json", "curve.csv", "curve.png")}
    args = ["bench", *TINY, "--eval-lengths", "16,32", "--schemes", "learned", "--memory-limit", "1"]
    args += ["--json", str(out["curve.json"]), "--csv", str(out["curve.csv"]), "--plot", str(out["curve.png"])]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    text = result.output
    assert "Time per token (µs)" in text and "Peak memory (MiB; peak resident set (VmHWM)" in text
    assert "longest within 1 GiB" in text and "fp32 (train.precision=fp32)" in text and "16 (n/a beyond)" in text
    assert "n/a" in text and "learned: from 32 tokens cannot measure: scheme 'learned' supports at most 16" in text
    data = json.loads(out["curve.json"].read_text())
    assert [r["status"] for r in data["rows"]] == ["measured", "cannot measure"]
    assert data["memory_limit_gib"] == 1 and data["reach"]["learned"]["longest"] == 16
    rows = list(csv.DictReader(out["curve.csv"].open()))
    assert [r["length"] for r in rows] == ["16", "32"] and float(rows[0]["us_per_token"]) > 0
    assert out["curve.png"].read_bytes()[:4] == b"\x89PNG"


def test_a_time_limit_shows_as_not_measured(tmp_path: Path) -> None:
    args = ["bench", *TINY, "--eval-lengths", "16,32", "--schemes", "nope", "--time-budget", "0.1"]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "–" in result.output and "none (time budget)" in result.output
    assert "nope: from 16 tokens not measured: time budget spent: stopped after" in result.output


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--eval-lengths", "1024,lots"], "--eval-lengths: expected comma-separated integers, got '1024,lots'"),
        (["--eval-lengths", "0,64"], "--eval-lengths: lengths must be >= 1, got 0"),
        (["--eval-lengths", ","], "--eval-lengths needs at least one value"),
        (["--eval-lengths", "64,64"], "a length is given twice"),
        (["--eval-lengths", "64", "--schemes", "rope,nosuch"], "unknown scheme 'nosuch'"),
        (["--eval-lengths", "64", "--memory-limit", "0"], "--memory-limit must be a positive number of GiB"),
        (["--eval-lengths", "64", "--dtypes", "fp32"], "--dtypes does not apply to the cost curve"),
        (["--eval-lengths", "64", "--lengths", "1,8"], "--lengths does not apply to the cost curve"),
        (["--eval-lengths", "64", "--vs", "hf"], "--vs does not apply"),
        (["--plot", "x.png"], "--plot writes the cost curve: it needs --eval-lengths"),
        (["--eval-lengths", "64", "--plot", "x.nosuch"], "cannot write a .nosuch figure"),
    ],
)
def test_curve_errors_are_one_line_and_exit_2(extra: list[str], words: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["bench", *TINY, *extra], terminal_width=200)
    assert result.exit_code == 2 and words in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_an_unwritable_output_fails_before_measuring(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    for flag in ("--json", "--csv", "--plot"):
        target = tmp_path / "file" / "out.png"  # its parent is a file
        result = runner.invoke(app, ["bench", *TINY, "--eval-lengths", "64", flag, str(target)], terminal_width=200)
        assert result.exit_code == 2 and "Time per token" not in result.output, (flag, result.output)
