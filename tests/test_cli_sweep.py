"""`posenc sweep` before any job runs: --help, the dry run's launcher check and plan, the busy-machine warning."""

from __future__ import annotations

import pytest
from launchers import needs_submitit
from typer.testing import CliRunner

from posenc_cli.cli import app

runner = CliRunner()


def test_help_lists_the_shipped_sweeps() -> None:
    result = runner.invoke(app, ["sweep", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for name in ("extrapolation", "seeds", "rope_scaling", "sizes", "passkey", "tasks"):
        assert f"{name}:" in result.output, name


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "hydra/launcher=submitit_slrum",
            "unknown launcher hydra/launcher=submitit_slrum (did you mean submitit_slurm?)",
        ),
        ("hydra.launcher.partiton=gpu", "unknown launcher key 'hydra.launcher.partiton' (did you mean partition?)"),
    ],
)
@needs_submitit
def test_dry_run_rejects_launcher_typos_in_one_line(override: str, message: str) -> None:
    args = ["sweep", "sizes", "hydra/launcher=submitit_slurm", override, "--dry-run"]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 2, result.output  # passed with exit 0; the real run then failed at once
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@needs_submitit
def test_dry_run_shows_where_the_jobs_go() -> None:
    args = ["sweep", "sizes", "hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu", "--dry-run"]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "launcher submitit_slurm (Slurm jobs): partition=gpu; other settings: Hydra's defaults" in result.output
    result = runner.invoke(app, ["sweep", "sizes", "--dry-run"], terminal_width=200)
    assert "launcher basic (one after another in this process)" in result.output
