"""A run that dropped its positions (DroPE) has no RoPE to scale, remap or search: every RoPE extension refuses it
in one line, and a sweep refuses a train.drope_at that could not do what it says before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli.app import app
from posenc_cli.run.train import train


@pytest.fixture(scope="module")
def dropped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dropped")
    run = root / "run"
    train(tiny_config(write_corpus(root), pos="rope", steps=4, drope_at=4, save_every=4, eval_every=4), run)
    return run


@pytest.mark.parametrize(
    "flags",
    [
        ["--yarn", "--factor", "2"],
        ["--method", "self-extend", "--window", "4", "--group", "2"],
        ["--longrope", "--factor", "2", "--search"],
    ],
    ids=["yarn", "self-extend", "longrope-search"],
)
def test_rope_extensions_refuse_a_dropped_run(flags: list[str], dropped: Path, tmp_path: Path) -> None:
    out = tmp_path / "child"
    result = CliRunner().invoke(app, ["extend", str(dropped), *flags, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "dropped its positions after step 4" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_a_sweep_refuses_drope_past_its_steps_in_a_dry_run(tmp_path: Path) -> None:
    args = ["sweep", "extrapolation", "pos=rope", "train.steps=10", "train.drope_at=20", "--dry-run"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "s")])
    assert result.exit_code == 2, result.output
    assert "train.drope_at=20 is past train.steps=10" in result.output
