"""End to end: train a tiny model on data=algorithmic for a few steps, then `posenc eval-algorithmic` from the CLI
(table per task × length with the in-distribution and beyond-L means, JSON, cells cached on the second call);
user errors are one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from posenc_cli.analysis.task_results import stored_algorithmic_results
from posenc_cli.cli import app
from posenc_cli.cli.algorithmic import parse_lengths
from posenc_cli.cli.tasks import print_task_summary
from posenc_cli.errors import ConfigError
from posenc_cli.evaluation.algorithmic import summarize
from posenc_cli.evaluation.tasks.algorithmic import gates_of
from posenc_cli.report.algorithmic_report import summary_table

runner = CliRunner()
TINY = ["model=tiny", "model.d_model=32", "model.n_layer=1", "model.n_head=2", "train.seq_len=64"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("alg") / "run"
    data = ["data=algorithmic", "data.tasks=[copy,parity]", "data.examples=200", "data.max_length=3"]
    trained = runner.invoke(app, ["train", *TINY, *data, "train.steps=2", "train.batch_size=2", "--out", str(path)])
    assert trained.exit_code == 0, trained.output
    return path


def test_eval_algorithmic_prints_the_table_and_caches_cells(run: Path, tmp_path: Path) -> None:
    out_json = tmp_path / "all.json"
    args = [str(run), "--examples", "2", "--device", "cpu"]
    first = runner.invoke(app, ["eval-algorithmic", *args, "--json", str(out_json)], terminal_width=200)
    assert first.exit_code == 0, first.output
    for text in (
        "copy",
        "parity",
        "≤L",
        "L+1..2L",
        "L = 3 (trained on lengths 3..3: the ≤L column); 2 examples per cell",
    ):
        assert text in first.output, first.output
    entries = json.loads(out_json.read_text())["runs"][0]["entries"]
    assert [(e["task"], e["length"]) for e in entries] == [(t, n) for t in ("copy", "parity") for n in range(1, 7)]
    assert all(e["status"] == "ok" and 0.0 <= e["accuracy"] <= 1.0 for e in entries)
    assert len(json.loads((run / "eval" / "algorithmic.json").read_text())["entries"]) == 12
    again = runner.invoke(app, ["eval-algorithmic", *args], terminal_width=200)
    assert again.exit_code == 0 and "12 of 12 cells reused" in again.output, again.output
    one = runner.invoke(app, ["eval-algorithmic", *args, "--tasks", "copy", "--lengths", "2,5-6"], terminal_width=200)
    assert one.exit_code == 0 and "3 of 3 cells reused" in one.output, one.output


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tasks", "copi"], "unknown task 'copi'; did you mean 'copy'?"),
        (["--lengths", "0-3"], "--lengths must be instance lengths >= 1, got 0"),
        (["--lengths", "5-2"], "range 5-2 runs backwards"),
        (["--lengths", "a"], "expected comma-separated integers"),
        (["--examples", "0"], "--examples must be in [1, 1000000], got 0"),
        (["--max-length", "0"], "--max-length must be in"),
        (["data.max_length=3"], "unexpected argument data.max_length=3"),
        (["--plot", "accuracy.xyz"], "cannot write a .xyz figure"),
    ],
)
def test_user_errors_are_one_line_and_write_nothing(run: Path, flags: list[str], message: str) -> None:
    before = sorted(p.name for p in (run / "eval").iterdir()) if (run / "eval").is_dir() else []
    result = runner.invoke(app, ["eval-algorithmic", str(run), *flags], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    after = sorted(p.name for p in (run / "eval").iterdir()) if (run / "eval").is_dir() else []
    assert after == before


def test_plot_draws_accuracy_against_length_per_task(run: Path, tmp_path: Path) -> None:
    plot = tmp_path / "accuracy.png"
    args = ["eval-algorithmic", str(run), "--examples", "2", "--device", "cpu", "--plot", str(plot)]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "accuracy.png" in result.output


def test_a_missing_run_directory_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["eval-algorithmic", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_parse_lengths() -> None:
    assert parse_lengths("1-3,8, 10-11,2") == [1, 2, 3, 8, 10, 11]
    with pytest.raises(ConfigError):
        parse_lengths(",")


def _result(run: str, scheme: str, accuracies: dict[int, float]) -> dict:
    entries = [
        {"task": "copy", "length": n, "train_max_length": 2, "examples": 4, "status": "ok", "accuracy": a}
        for n, a in accuracies.items()
    ]
    return {"run": run, "scheme": scheme, "entries": entries}


def test_summary_table_shows_both_means_per_run() -> None:
    results = [_result("a", "rope", {1: 1.0, 2: 0.5, 3: 0.25, 4: 0.0}), _result("b", "nope", {1: 1.0, 3: 1.0})]
    summaries = [summarize(r["entries"]) for r in results]
    table = summary_table(results, summaries, gates_of(results))
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    assert "75 / 12" in text  # (100 + 50) / 2 in distribution; (25 + 0) / 2 = 12.5 beyond, printed as 12
    assert "100 / 100" in text
    assert summary_table(results[:1], summaries[:1], gates_of(results[:1])) is None  # one run: its own table


def test_a_sweeps_end_reads_the_stored_cells_of_the_current_checkpoint(run: Path) -> None:
    evaluated = runner.invoke(app, ["eval-algorithmic", str(run), "--examples", "2", "--device", "cpu"])
    assert evaluated.exit_code == 0, evaluated.output
    records = [
        SimpleNamespace(status="done", run_dir=str(run), label="pos=rope", scheme="rope"),
        SimpleNamespace(status="failed", run_dir=str(run), label="broken", scheme="rope"),
    ]
    (result,) = stored_algorithmic_results(records)
    assert result["run"] == "pos=rope" and len(result["entries"]) == 12
    console = Console(width=200, record=True)
    print_task_summary(records, console)  # every registered task's summary: here the algorithmic one
    assert "L+1..2L" in console.export_text()
    doc = json.loads((run / "eval" / "algorithmic.json").read_text())
    for e in doc["entries"]:
        e["checkpoint"]["step"] = -1  # cells of another checkpoint are not shown
    (run / "eval" / "algorithmic.json").write_text(json.dumps(doc))
    assert stored_algorithmic_results(records) == []
