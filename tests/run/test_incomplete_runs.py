"""A run whose training did not finish is never evaluated, extended or exported as if it had (issue "Numbers that
cannot be mixed up"): a killed `extend --finetune-steps` child still holds its parent's weights at step 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.config import ExtendConfig
from posenc_cli.errors import CheckpointError
from posenc_cli.extension.extend import extend_run
from posenc_cli.run.load import load_run
from posenc_cli.run.meta import incomplete_reason, read_meta, require_complete
from posenc_cli.run.train import train

runner = CliRunner()


class Killed(Exception):
    """Stands for a SIGKILL: training stops at once, after whatever it had committed."""


def kill_at(event: str, step: int | None = None) -> Any:
    def callback(ev: dict[str, Any]) -> None:
        if ev.get("event") == event and (step is None or ev.get("step") == step):
            raise Killed

    return callback


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished RoPE parent, the child a killed `extend --finetune-steps 6` left (meta.json running at step 0, as
    train writes it when the fine-tune starts), and a training run killed after its step-2 checkpoint."""
    root = tmp_path_factory.mktemp("incomplete")
    corpus = write_corpus(root)
    parent, child, killed = root / "parent", root / "child", root / "killed"
    train(tiny_config(corpus, pos="rope", steps=2), parent)
    with pytest.raises(Killed):
        ext = ExtendConfig(method="linear", factor=2.0, finetune_steps=6)
        extend_run(parent, child, ext, callback=kill_at("start"))
    with pytest.raises(Killed):
        train(tiny_config(corpus, pos="rope", steps=6, save_every=2), killed, callback=kill_at("step", 3))
    return {"parent": parent, "child": child, "killed": killed}


def test_the_simulated_kills_left_what_a_sigkill_leaves(runs: dict[str, Path]) -> None:
    child, killed = read_meta(runs["child"]), read_meta(runs["killed"])
    assert (child["status"], child["step"], child["steps"]) == ("running", 0, 6)
    assert child["extend"]["method"] == "linear"
    assert (killed["status"], killed["step"], killed["steps"]) == ("running", 2, 6)


def test_incomplete_reason() -> None:
    assert incomplete_reason({"status": "complete", "step": 60, "steps": 60}) is None
    assert incomplete_reason({"status": "running", "step": 0, "steps": 60}) == "training stopped at step 0 of 60"
    assert incomplete_reason({"status": "interrupted", "step": 7, "steps": 60}) == "training stopped at step 7 of 60"
    assert incomplete_reason({"status": "complete", "step": 7, "steps": 60}) == "marked complete at step 7 of 60"
    assert incomplete_reason({"step": 60, "steps": 60}) is None  # no status: an older run
    assert incomplete_reason({"step": 3, "steps": 60}) == "training stopped at step 3 of 60"
    with pytest.raises(CheckpointError, match="^RUN is incomplete .*; resume it with `posenc train --resume RUN`"):
        require_complete({"status": "running", "step": 0, "steps": 60}, "RUN")


@pytest.mark.parametrize("name, where", [("child", "step 0 of 6"), ("killed", "step 2 of 6")])
def test_loading_an_incomplete_run_for_use_is_refused(runs: dict[str, Path], name: str, where: str) -> None:
    with pytest.raises(CheckpointError, match=f"is incomplete \\(training stopped at {where}\\)"):
        load_run(runs[name])
    assert load_run(runs[name], complete_only=False).meta.status == "running"  # what inspecting it may still do
    load_run(runs["parent"])


@pytest.mark.parametrize("name, where", [("child", "step 0 of 6"), ("killed", "step 2 of 6")])
def test_cli_eval_extrapolate_refuses_an_incomplete_run_in_one_line(
    runs: dict[str, Path], name: str, where: str
) -> None:
    before = sorted(p.name for p in runs[name].iterdir())
    result = runner.invoke(app, ["eval-extrapolate", str(runs[name]), "--lengths", "1,2"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert f"is incomplete (training stopped at {where}); resume it with" in lines[0]
    assert sorted(p.name for p in runs[name].iterdir()) == before  # no results stored under the run's label


def test_cli_export_refuses_an_incomplete_run(runs: dict[str, Path], tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", str(runs["child"]), "--out", str(tmp_path / "hf")])
    assert result.exit_code == 2, result.output
    assert "is incomplete (training stopped at step 0 of 6)" in result.stderr
    assert not (tmp_path / "hf").exists()


def test_the_suggested_resume_finishes_the_child_which_then_loads(runs: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    child = Path(shutil.copytree(runs["child"], tmp_path / "child"))
    result = runner.invoke(app, ["train", "--resume", str(child)])
    assert result.exit_code == 0, result.output
    meta = read_meta(child)
    assert (meta["status"], meta["step"], meta["steps"]) == ("complete", 6, 6)
    assert meta["extend"]["method"] == "linear" and meta["parent"] == str(runs["parent"].resolve())
    assert load_run(child).config.pos.scaling.factor == 2.0  # type: ignore[attr-defined]


def test_compare_does_not_show_cells_stored_on_an_incomplete_run(runs: dict[str, Path], tmp_path: Path) -> None:
    """Cells that an earlier posenc stored on a killed child (its weights still the parent's) are not its numbers."""
    import shutil

    from posenc_cli.config import EvalConfig
    from posenc_cli.evaluation.tasks.extrapolate import evaluate_run

    child = Path(shutil.copytree(runs["child"], tmp_path / "child"))
    evaluate_run(load_run(child, complete_only=False), EvalConfig(lengths=[1.0], tokens=32))  # as before the fix
    result = runner.invoke(app, ["compare", str(child)], terminal_width=200)
    assert "incomplete (training stopped at step 0 of 6); resume it with posenc train --resume" in result.output
    assert "1×" not in result.output  # no table of its cells
