"""The API functions behind the commands (issue #41 items 1 and 6): extend and calibrate with evaluate=True, data,
schemes, export, load_model, train's progress, and compare's refusals; a tiny RoPE run, nothing printed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from train_utils import tiny_overrides, write_corpus

from posenc_cli import api
from posenc_cli.errors import UserError


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("api-commands"))


@pytest.fixture(scope="module")
def rope(corpus: Path) -> Path:
    """A 4-step RoPE run, never evaluated (the children below store their cells in themselves)."""
    return api.train([*tiny_overrides(corpus, steps=4), "pos=rope"], out=corpus.parent / "rope").run_dir


def test_train_reports_progress_to_a_callback_and_a_bar(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events: list[dict[str, Any]] = []
    api.train([*tiny_overrides(corpus, steps=2)], out=corpus.parent / "cb", callback=events.append)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "data" and "start" in kinds and kinds.count("step") == 2
    assert capsys.readouterr() == ("", "")  # a script's api.train is silent unless asked

    api.train([*tiny_overrides(corpus, steps=2)], out=corpus.parent / "bar", progress=True)
    shown = capsys.readouterr().out
    assert "train" in shown and "new run" in shown and "step 2" in shown  # the start line and the log lines


def test_extend_evaluates_parent_and_child(rope: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []
    outcome = api.extend(rope, tmp_path / "yarn", method="yarn", factor=2.0, threads=1, evaluate=True,
                         status=seen.append)  # fmt: skip
    assert outcome.result.status == "created" and outcome.evaluation is not None
    assert [Path(doc["path"]).resolve() for doc in outcome.evaluation] == [
        rope.resolve(),
        (tmp_path / "yarn").resolve(),
    ]
    assert [doc["label"] for doc in outcome.evaluation] == ["rope", "yarn (rope)"]  # as compare labels them
    assert any(e["status"] == "ok" for doc in outcome.evaluation for e in doc["entries"])
    assert seen == [f"evaluating {rope} ...", f"evaluating {tmp_path / 'yarn'} ..."]
    assert not (rope / "eval").exists()  # the parent is never written
    assert api.extend(rope, tmp_path / "yarn", method="yarn", factor=2.0).evaluation is None  # only when asked
    assert capsys.readouterr() == ("", "")


def test_calibrate_evaluates_parent_and_child(rope: Path, tmp_path: Path) -> None:
    result = api.calibrate(rope, "drope", ["2x"], tmp_path / "drope", tokens=64, refine=0, threads=1, evaluate=True)
    assert result.status == "created" and result.c is not None and result.evaluation is not None
    assert [Path(doc["path"]).resolve() for doc in result.evaluation] == [
        rope.resolve(),
        (tmp_path / "drope").resolve(),
    ]


def test_prepare_data_returns_the_cache_summary(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stages: list[str] = []
    overrides = ["data=text", f"data.paths=[{corpus}]", "data.val_fraction=0.1"]
    info = api.prepare_data(overrides, progress=lambda stage, done, total: stages.append(stage))
    assert info["source"] == "text" and info["tokens"]["train"] > 0 and info["tokens"]["val"] > 0
    assert api.prepare_data(overrides)["reused"] is True
    assert capsys.readouterr() == ("", "")


def test_schemes_lists_the_registry() -> None:
    rows = {row["name"]: row for row in api.schemes()}
    assert rows["rope"]["hooks"] == "rotate" and rows["rope"]["learned"] == "no"
    assert rows["learned"]["extrapolates"] == "no" and rows["alibi"]["extrapolates"] == "yes"
    assert set(rows["rope"]) == {"name", "hooks", "learned", "extrapolates", "paper"}


def test_load_model_and_export(rope: Path, tmp_path: Path) -> None:
    run = api.load_model(rope)
    assert run.config.pos.name == "rope" and run.meta.step == 4 and not run.model.training
    result = api.export(rope, tmp_path / "hf")
    assert result.architecture == "GPTNeoXForCausalLM" and (tmp_path / "hf" / "config.json").is_file()
    assert result.max_abs_diff is not None and result.max_abs_diff < 1e-4


def test_compare_refuses_no_run_and_unevaluated_runs(rope: Path) -> None:
    with pytest.raises(UserError, match="give at least one run or sweep directory"):
        api.compare([])
    with pytest.raises(UserError, match="no ppl cells stored below .*evaluate first"):
        api.compare([rope])


def test_viz_encoding_writes_its_figure_and_returns_the_grids(tmp_path: Path) -> None:
    picture = api.viz_encoding(["pos=rope", "model=tiny"], out=tmp_path / "rope.png", length=32)
    assert picture.path == tmp_path / "rope.png" and picture.path.stat().st_size > 0 and picture.grids
    with pytest.raises(UserError, match="overrides apply to composed configs"):
        api.viz_encoding(["pos=rope"], tmp_path)
    with pytest.raises(UserError, match="--multiple must be > 0"):
        api.viz_compare([tmp_path], multiple=0)


def test_cost_curve_checks_its_outputs_before_measuring(tmp_path: Path) -> None:
    """Measuring and writing are the command's slow test (tests/cli/test_cli_bench.py), through this function."""
    tiny = ["model.d_model=32", "model.n_layer=1", "model.n_head=2", "train.seq_len=16", "train.device=cpu"]
    messages: list[str] = []
    with pytest.raises(UserError, match="it is a directory"):
        api.cost_curve(tiny, lengths=[16], json_path=tmp_path, progress=messages.append)
    assert messages == [] and list(tmp_path.iterdir()) == []


def test_profile_rows_and_the_main_process() -> None:
    doc = {"phases": {"eval L=32": {"seconds": 1.0}, "steps": {"seconds": 3.0, "gflop": 6.0, "gflops_per_s": 2.0}}}
    rows = api.profile_rows(doc)
    assert [r["phase"] for r in rows] == ["steps", "eval L=32"] and rows[0]["share"] == pytest.approx(0.75)
    assert api.is_main_process()  # no torchrun here


def test_sweep_control_checks_the_threshold_and_writes_picks() -> None:
    from posenc_cli.api.sweep_control import check_competence, pick_lines, startup_seconds

    with pytest.raises(UserError, match="--competence must be an accuracy in"):
        check_competence(1.5)
    entry = {"group": {"pos": "rope"}, "picked": {"train.lr": 0.003}, "value": 1.2345, "points": [{"value": 1.0}] * 6}
    assert pick_lines({"metric": "val_loss", "groups": [entry]}) == [
        "pos=rope: train.lr=0.003 (val_loss 1.234, best of 6)"
    ]
    assert startup_seconds() is None or startup_seconds() > 0
