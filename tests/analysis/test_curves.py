"""Learning curves (issue #38): a task's in-distribution accuracy against training steps, from runs equal but for
their steps, in `compare`'s table, its markdown and the API. Micro runs trained for 1 and 2 steps with hand-written
eval-tasks cells, so that each point's score sits where the test needs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc_cli import api
from posenc_cli.analysis.curves import experiment_key
from posenc_cli.cli import app
from posenc_cli.data.ruler.base import GENERATOR_VERSION
from posenc_cli.evaluation.results import checkpoint_identity
from posenc_cli.run.meta import read_run_meta

runner = CliRunner()
TINY = ["model=tiny", "model.d_model=16", "model.n_layer=1", "model.n_head=2", "train.seq_len=256"]
TRAIN = ["data=tasks", "data.tasks=[niah-single]", "data.episodes=400", "train.batch_size=2", "train.threads=1"]
RUNS = {  # name: (overrides, niah-single's score at 1x)
    "short": (["train.steps=1"], 0.4),
    "long": (["train.steps=2"], 0.95),
    "long-seed1": (["train.steps=2", "train.seed=1"], 0.5),  # no run of seed 1 at 1 step: no curve
    "other-lr": (["train.steps=2", "train.lr=0.002"], 0.7),  # another experiment: no curve either
}


def cells(run: Path, score: float) -> None:
    checkpoint = checkpoint_identity(read_run_meta(run))
    entries = [
        {"task": "niah-single", "length": length, "multiple": length / 256, "depth": 0.0, "trials": 10,
         "scoring": "contains", "generate": 128, "generator": GENERATOR_VERSION, "checkpoint": checkpoint,
         "status": "ok", "score": score if length == 256 else 0.0}
        for length in (256, 512)
    ]  # fmt: skip
    doc = {"schema_version": 1, "run": run.name, "scheme": "rope", "train_length": 256, "base_length": 256}
    (run / "eval").mkdir(exist_ok=True)
    (run / "eval" / "tasks.json").write_text(json.dumps({**doc, "entries": entries}))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("curves")
    for name, (overrides, score) in RUNS.items():
        trained = runner.invoke(app, ["train", *TINY, *TRAIN, *overrides, "--out", str(root / name)])
        assert trained.exit_code == 0, trained.output
        cells(root / name, score)
    return root


def test_the_api_gives_each_point_of_the_curve_with_its_gate(runs: Path) -> None:
    frame = api.learning_curves([runs])
    assert list(frame["steps"]) == [1, 2] and set(frame["task"]) == {"niah-single"}
    assert list(frame["curve"]) == ["short · seed 0"] * 2  # named by its first run
    assert list(frame["in_distribution"]) == pytest.approx([0.4, 0.95])
    assert list(frame["competence"]) == ["not learned", "learned"]
    assert [Path(p).name for p in frame["run_dir"]] == ["short", "long"]
    assert list(api.learning_curves([runs], competence=0.3)["competence"]) == ["learned", "learned"]
    assert api.learning_curves([runs / "long", runs / "other-lr"]).empty  # no two runs differ only in steps


def test_compare_prints_the_curve_after_the_task_tables(runs: Path) -> None:
    shown = runner.invoke(app, ["compare", str(runs)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    curves = shown.output[shown.output.index("Learning curves") :]
    assert "1 step " in curves and "2 steps" in curves
    row = next(line for line in curves.splitlines() if "short · seed 0" in line)
    assert "40% ✗ not learned" in row and "95%" in row
    assert "seed 1" not in curves and "other-lr" not in curves
    alone = runner.invoke(app, ["compare", str(runs / "long")], terminal_width=200)
    assert alone.exit_code == 0 and "Learning curves" not in alone.output


def test_compare_markdown_has_the_curve_table(runs: Path) -> None:
    shown = runner.invoke(app, ["compare", str(runs), "--format", "markdown"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "| curve | task | 1 step | 2 steps |" in shown.output
    assert "| short · seed 0 | niah-single (contains) | 40% ✗ not learned | 95% |" in shown.output


def test_the_points_of_a_curve_are_runs_equal_but_for_their_steps() -> None:
    def identity(**flat: object) -> str:
        return json.dumps({"pos.name": "rope", "train.lr": 0.001, **flat}, sort_keys=True)

    short, long = experiment_key(identity(**{"train.steps": 4000})), experiment_key(identity(**{"train.steps": 8000}))
    assert short is not None and long is not None and short[0] == long[0] and (short[1], long[1]) == (4000, 8000)
    # DroPE's drop step as its fraction of the steps: 7/8 of 4,000 and of 8,000 are one recipe, not RoPE's
    drope = experiment_key(identity(**{"train.steps": 4000, "train.drope_at": 3500}))
    drope_long = experiment_key(identity(**{"train.steps": 8000, "train.drope_at": 7000}))
    assert drope is not None and drope_long is not None and drope[0] == drope_long[0] != short[0]
    assert experiment_key(identity(**{"train.steps": 4000, "train.lr": 0.003}))[0] != short[0]  # type: ignore[index]
    assert experiment_key(None) is None


def test_runs_of_one_label_and_seed_are_told_apart_in_the_task_tables(tmp_path: Path) -> None:
    """A seed's run at the chosen steps and at twice them (a sweep's `seeds` and `long` stages) share label and seed:
    their task rows name where they differ, as they did not (two identical `rope` rows)."""
    for stage, steps, score in (("seeds", 1, 0.4), ("long", 2, 0.95)):
        run = tmp_path / stage / "rope"
        trained = runner.invoke(app, ["train", *TINY, *TRAIN, f"train.steps={steps}", "--out", str(run)])
        assert trained.exit_code == 0, trained.output
        cells(run, score)
    frame = api.task_scores([tmp_path / "seeds", tmp_path / "long"]).set_index("run")
    assert frame.loc["rope · seed 0 · seeds", "in_distribution"] == pytest.approx(0.4)
    assert frame.loc["rope · seed 0 · long", "in_distribution"] == pytest.approx(0.95)
    assert list(api.learning_curves([tmp_path])["steps"]) == [1, 2]
