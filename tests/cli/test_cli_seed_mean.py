"""`posenc compare --seed-mean`: the task tables show one row per experiment (mean ± sd over its seeds, the gate's
count) instead of a row per seed, in the terminal, in markdown and in CSV; without the flag, a row per seed."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_task_seeds import write_seed_runs
from typer.testing import CliRunner

from posenc_cli.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_seed_runs(tmp_path_factory.mktemp("cli-seeds"))


def flat_lines(text: str) -> list[str]:
    return [" ".join(x.replace("│", " ").split()) for x in text.splitlines()]


def test_the_flag_prints_a_row_per_experiment(runs: Path) -> None:
    shown = runner.invoke(app, ["compare", str(runs), "--seed-mean"], terminal_width=250)
    assert shown.exit_code == 0, shown.output
    lines = flat_lines(shown.output)
    assert "niah-single · RULER score over seeds (%, mean ± sd)" in lines
    assert "rope 3 95 ± 5 50 ± 10 n/a (2/3) 95 3/3 learned" in lines
    assert "rope 3 82 ± 28 30 ± 20 82 ✗ 2/3 learned" in lines  # niah-multikey: seed 2 at 50%
    assert "alibi 2 30 ± 14 20 ± 14 30 ⊘ not trained on this task" in lines
    assert "alibi 2 n/a (1/2) n/a (1/2) – n/a – (not measured) · 1/2 learned" in lines  # –: no 4× stored
    assert "t5 1 90 70 – 90 1/1 learned" in lines  # one seed: no ±
    assert "seed 0" not in shown.output
    per_seed = runner.invoke(app, ["compare", str(runs)], terminal_width=250)
    assert per_seed.exit_code == 0 and "rope · seed 2" in per_seed.output and "3/3 learned" not in per_seed.output


def test_markdown_and_csv_hold_the_means(runs: Path) -> None:
    shown = runner.invoke(app, ["compare", str(runs), "--seed-mean", "--format", "markdown"], terminal_width=250)
    assert shown.exit_code == 0, shown.output
    assert "| rope | 3 | 95 ± 5 | 50 ± 10 | n/a (2/3) | 95 | 3/3 learned |" in shown.output
    assert "| t5 | 1 | 90 | 70 | – | 90 | 1/1 learned |" in shown.output
    table = runner.invoke(app, ["compare", str(runs), "--seed-mean", "--format", "csv"], terminal_width=250)
    assert table.exit_code == 0, table.output
    assert table.output.splitlines()[0].endswith(",competence,sd,n,measured,n_learned")
    assert "rope · seed" not in table.output
