"""The competence gate in every task table (issue #38, item 2): a run trained on data=tasks (niah-single only) with
hand-written cells, so that its in-distribution score sits where each test needs it. Tables (`compare`'s task
summary, eval-tasks' tables), results.csv, the API's DataFrame and the heatmap mark "not learned" and "not trained
on this task" apart; `--competence` moves the line from the CLI and the API; eval-algorithmic on a run never trained
on the algorithmic tasks says so instead of a training length it never had."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc_cli import api
from posenc_cli.analysis.gather import gather
from posenc_cli.analysis.task_results import stored_task_results
from posenc_cli.cli import app
from posenc_cli.data.ruler.base import GENERATOR_VERSION
from posenc_cli.evaluation.results import checkpoint_identity
from posenc_cli.evaluation.tasks.retrieval import retrieval_gates
from posenc_cli.report.retrieval_report import tasks_figure, tasks_tables
from posenc_cli.run.meta import read_run_meta

runner = CliRunner()
TINY = ["model=tiny", "model.d_model=16", "model.n_layer=1", "model.n_head=2", "train.seq_len=256"]
TRAIN = ["data=tasks", "data.tasks=[niah-single]", "data.episodes=400", "train.steps=1", "train.batch_size=2"]
# (task, length, multiple, depth) -> score: niah-single 60% in distribution (1×), niah-multikey perfect but untrained
SCORES = {
    ("niah-single", 256, 1.0, 0.0): 0.8,
    ("niah-single", 256, 1.0, 1.0): 0.4,
    ("niah-single", 512, 2.0, 0.0): 0.1,
    ("niah-single", 512, 2.0, 1.0): 0.0,
    ("niah-multikey", 256, 1.0, 0.0): 1.0,
    ("niah-multikey", 512, 2.0, 0.0): 1.0,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gate") / "tasks-run"
    trained = runner.invoke(app, ["train", *TINY, *TRAIN, "train.threads=1", "--out", str(path)])
    assert trained.exit_code == 0, trained.output
    checkpoint = checkpoint_identity(read_run_meta(path))
    entries = [
        {"task": task, "length": length, "multiple": multiple, "depth": depth, "trials": 10, "scoring": "contains",
         "generate": 128, "generator": GENERATOR_VERSION, "checkpoint": checkpoint, "status": "ok", "score": score}
        for (task, length, multiple, depth), score in SCORES.items()
    ]  # fmt: skip
    doc = {"schema_version": 1, "run": path.name, "scheme": "rope", "train_length": 256, "base_length": 256}
    (path / "eval").mkdir(exist_ok=True)
    (path / "eval" / "tasks.json").write_text(json.dumps({**doc, "entries": entries}))
    return path


def test_compare_marks_unlearned_and_untrained_tasks(run: Path) -> None:
    shown = runner.invoke(app, ["compare", str(run)], terminal_width=250)
    assert shown.exit_code == 0, shown.output
    single = shown.output[shown.output.index("niah-single · RULER score") :]
    multikey = shown.output[shown.output.index("niah-multikey · RULER score") : shown.output.index("niah-single")]
    assert "60% ✗ not learned" in single and "✗ not learned (" in single  # ≤L and the effective-length column
    assert "⊘ not trained on this task" in multikey and "not learned" not in multikey.split("Competence gate")[0]
    lowered = runner.invoke(app, ["compare", str(run), "--competence", "0.5"], terminal_width=250)
    assert lowered.exit_code == 0, lowered.output
    single = lowered.output[lowered.output.index("niah-single · RULER score") :]
    assert "60%" in single and "✗ not learned" not in single.split("Competence gate")[0]
    assert "below 50%" in " ".join(single.split())  # the caption names the threshold used


def test_compare_markdown_lists_the_task_rows_with_their_marks(run: Path) -> None:
    shown = runner.invoke(app, ["compare", str(run), "--format", "markdown"], terminal_width=250)
    assert shown.exit_code == 0, shown.output
    assert "| tasks-run | niah-single (contains) | 60% ✗ not learned | 5% |" in shown.output
    assert "| tasks-run | niah-multikey (contains) | 100% ⊘ not trained on this task | 100% |" in shown.output
    lowered = runner.invoke(app, ["compare", str(run), "--format", "markdown", "--competence", "0.5"])
    assert "| tasks-run | niah-single (contains) | 60% | 5% |" in lowered.output


def test_the_threshold_is_checked_on_the_command_line(run: Path) -> None:
    for command in (["compare", str(run)], ["eval-tasks", str(run)], ["eval-algorithmic", str(run)]):
        refused = runner.invoke(app, [*command, "--competence", "1.5"])
        assert refused.exit_code == 2 and "--competence must be an accuracy in [0, 1]" in refused.output
        assert len(refused.output.strip().splitlines()) == 1, refused.output


@pytest.mark.integration  # a sweep run
def test_a_sweep_takes_the_threshold_too(tmp_path: Path) -> None:
    planned = runner.invoke(app, ["sweep", "extrapolation", "--dry-run", "--competence", "0.5", "--out", str(tmp_path)])
    assert planned.exit_code == 0, planned.output
    refused = runner.invoke(app, ["sweep", "extrapolation", "--dry-run", "--competence", "2", "--out", str(tmp_path)])
    assert refused.exit_code == 2 and "--competence must be an accuracy in [0, 1]" in refused.output, refused.output


def test_results_csv_flags_the_rows_and_keeps_the_numbers(run: Path, tmp_path: Path) -> None:
    report = api.comparison([run], out=tmp_path / "out")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "out" / "results.csv").read_text())))
    tasks = {(r["task"], r["length"]): r for r in rows if r["task"]}
    assert tasks[("niah-single", "512")]["competence"] == "not learned"
    assert float(tasks[("niah-single", "512")]["score"]) == pytest.approx(0.05)  # the number stays
    assert float(tasks[("niah-single", "256")]["in_distribution"]) == pytest.approx(0.6)
    assert tasks[("niah-multikey", "512")]["competence"] == "not trained on this task"
    assert report.comparison.to_csv().replace("\r\n", "\n") == (tmp_path / "out" / "results.csv").read_text()
    lowered = api.comparison([run], competence=0.5).comparison.to_csv()
    assert "not learned" not in lowered and ",learned" in lowered


def test_the_api_frame_has_a_competence_column(run: Path) -> None:
    frame = api.task_scores([run]).set_index("task")
    assert frame.loc["niah-single", "competence"] == "not learned" and not frame.loc["niah-single", "learned"]
    assert frame.loc["niah-single", "in_distribution"] == pytest.approx(0.6)
    assert frame.loc["niah-single", "beyond"] == pytest.approx(0.05)
    assert frame.loc["niah-multikey", "competence"] == "not trained on this task"
    assert frame.attrs["competence"] == 0.9
    assert bool(api.task_scores([run], competence=0.6).set_index("task").loc["niah-single", "learned"])


def test_eval_tasks_tables_and_heatmap_mark_the_run(run: Path) -> None:
    results = stored_task_results(gather([run]))
    tasks = ["niah-single", "niah-multikey"]
    from rich.console import Console

    console = Console(width=250, record=True)
    for table in tasks_tables(results, tasks, retrieval_gates(results)):
        console.print(table)
    text = console.export_text()
    assert "≤L" in text and "60% ✗ not learned" in text and "100% ⊘ not trained on this task" in text
    figure = tasks_figure(results, tasks, retrieval_gates(results))
    titles = [ax.get_title() for ax in figure.axes if ax.get_title()]
    assert any("niah-single" in t and "✗ not learned" in t for t in titles), titles
    assert any("niah-multikey" in t and "⊘ not trained on this task" in t for t in titles), titles
    hatched = [p.get_hatch() for ax in figure.axes for p in ax.patches]
    assert "//" in hatched and "xx" in hatched  # the two states look different
    (legend,) = figure.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["✗ not learned (≤L below 90%)", "⊘ not trained on this task"]
    learned = tasks_figure(results, ["niah-single"], retrieval_gates(results, 0.5), competence=0.5)
    assert not learned.legends and not [p for ax in learned.axes for p in ax.patches if p.get_hatch()]


def test_eval_algorithmic_on_a_run_never_trained_on_it_says_so(run: Path) -> None:
    args = ["eval-algorithmic", str(run), "--tasks", "copy", "--lengths", "1-2", "--max-length", "1"]
    result = runner.invoke(app, [*args, "--examples", "1", "--device", "cpu", "--threads", "1"], terminal_width=250)
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert "⊘ not trained on this task" in flat and "(trained on lengths <= L)" not in flat


def test_the_algorithmic_summary_marks_tasks_not_learned() -> None:
    from rich.console import Console

    from posenc_cli.evaluation.algorithmic import summarize
    from posenc_cli.evaluation.tasks.algorithmic import gates_of
    from posenc_cli.report.algorithmic_report import summary_table

    def result(run: str, accuracies: dict[int, float]) -> dict:
        cells = [{"task": "copy", "length": n, "train_max_length": 2, "examples": 4, "status": "ok", "accuracy": a}
                 for n, a in accuracies.items()]  # fmt: skip
        return {"run": run, "scheme": "rope", "entries": cells}

    results = [result("a", {1: 1.0, 2: 0.5, 3: 0.25, 4: 0.0}), result("b", {1: 1.0, 2: 1.0, 3: 1.0})]
    for competence, marked in ((0.9, True), (0.7, False)):
        console = Console(width=200, record=True)
        summaries = [summarize(r["entries"]) for r in results]
        console.print(summary_table(results, summaries, gates_of(results, competence), competence))
        lines = console.export_text().splitlines()
        a, b = next(x for x in lines if "│ a" in x), next(x for x in lines if "│ b" in x)
        assert ("75 / 12 ✗ not learned" in a) is marked and "75 / 12" in a
        assert "100 / 100" in b and "not learned" not in b


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run trained one episode per row whose 1× cells ask for prompts 10 tokens longer than its longest training
    prompt (meta.json's data.longest_prompt): its 1× is itself a length it never trained on."""
    path = tmp_path_factory.mktemp("gate") / "short-run"
    args = ["train", *TINY, *TRAIN, "train.packing=none", "train.threads=1", "--out", str(path)]
    trained = runner.invoke(app, args)
    assert trained.exit_code == 0, trained.output
    meta = read_run_meta(path)
    generate = 256 - (meta.record["data"]["longest_prompt"] + 10)  # the prompt: the length less the budget
    entries = [
        {"task": "niah-single", "length": length, "multiple": multiple, "depth": depth, "trials": 10,
         "scoring": "contains", "generate": generate, "generator": GENERATOR_VERSION,
         "checkpoint": checkpoint_identity(meta), "status": "ok", "score": score}
        for (task, length, multiple, depth), score in SCORES.items() if task == "niah-single"
    ]  # fmt: skip
    doc = {"schema_version": 1, "run": path.name, "scheme": "rope", "train_length": 256, "base_length": 256}
    (path / "eval").mkdir(exist_ok=True)
    (path / "eval" / "tasks.json").write_text(json.dumps({**doc, "entries": entries}))
    return path


def test_a_run_whose_1x_is_longer_than_its_examples_is_marked_so_everywhere(short_run: Path, tmp_path: Path) -> None:
    shown = runner.invoke(app, ["compare", str(short_run), "--format", "markdown"], terminal_width=250)
    assert shown.exit_code == 0, shown.output
    assert "| short-run | niah-single (contains) | 60% ⇥ longer than its training examples | 5% |" in shown.output
    assert "not learned" not in shown.output.split("Competence gate")[0]
    api.comparison([short_run], out=tmp_path / "out")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "out" / "results.csv").read_text())))
    assert {r["competence"] for r in rows if r["task"]} == {"longer than its training examples"}
    frame = api.task_scores([short_run]).set_index("task")
    assert frame.loc["niah-single", "competence"] == "longer than its training examples"
    assert not frame.loc["niah-single", "learned"]
