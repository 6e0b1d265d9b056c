"""The task evaluations through the API alone (`api.evaluate_passkey`, `evaluate_tasks`, `evaluate_algorithmic`) on a
tiny run: each returns a `TaskEvaluation` (result docs, gates, `--json`'s document, one row per cell) and prints
nothing; `api.task_summaries` gives what a sweep and `compare` print after their table (passkey's too, which printed
nothing before), and refuses a run that was never evaluated."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc_cli import api
from posenc_cli.cli import app
from posenc_cli.errors import ConfigError, UserError

TINY = ["model=tiny", "model.d_model=16", "model.n_layer=1", "model.n_head=2", "train.seq_len=64"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("api-tasks") / "run"
    args = ["train", *TINY, "train.steps=1", "train.batch_size=2", "train.threads=1", "--out", str(path)]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    return path


def test_the_task_evaluations_return_data_and_print_nothing(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UserError, match="no stored task cells"):  # nothing evaluated yet: refused, not empty
        api.task_summaries([run])
    passkey = api.evaluate_passkey([run], lengths=[1], depths=[0.0, 1.0], trials=1, device="cpu", threads=1)
    assert passkey.tasks == ["passkey"] and passkey.cells == 2 and passkey.reused == 0
    assert passkey.gates[0]["passkey"].status == "not trained on this task"  # a stdlib run never saw a passkey
    frame = passkey.frame()
    assert list(frame["task"]) == ["passkey", "passkey"] and list(frame["depth"]) == [0.0, 1.0]
    assert "reused" not in passkey.to_json()["runs"][0]
    tasks = api.evaluate_tasks(
        [run], tasks=["niah-single"], abs_lengths=[64], depths=[0.0], trials=1, tokens_to_generate=4, device="cpu"
    )
    assert tasks.tasks == ["niah-single"] and ("niah-single", "contains") in tasks.gates[0]
    algorithmic = api.evaluate_algorithmic([run], tasks=["copy"], lengths=[1, 2], examples=1, device="cpu")
    assert algorithmic.tasks == ["copy"] and [s.task for s in algorithmic.summaries[0]] == ["copy"]
    assert capsys.readouterr().out == ""
    names = [s.task for s in api.task_summaries([run])]
    assert names == ["niah-single", "passkey", "algorithmic"]  # retrieval tasks, then passkey, then algorithmic
    shown = CliRunner().invoke(app, ["compare", str(run)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "Passkey retrieval accuracy" in shown.output and "niah-single · RULER score" in shown.output


def test_bad_settings_are_refused_before_anything_is_measured(run: Path) -> None:
    with pytest.raises(ConfigError, match="unknown task 'niah' for eval-tasks"):
        api.evaluate_tasks([run], tasks=["niah"])
    with pytest.raises(ConfigError, match="--competence must be an accuracy"):
        api.evaluate_algorithmic([run], competence=2.0)
    with pytest.raises(ConfigError, match="at least one run directory"):
        api.evaluate_passkey([])
