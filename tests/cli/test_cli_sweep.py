"""`posenc sweep` before any job runs: --help, the dry run's launcher check and plan, the busy-machine warning."""

from __future__ import annotations

import pytest
from launchers import needs_joblib, needs_submitit
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.config import config_dir

pytestmark = pytest.mark.integration  # end to end (sweeps, launchers, DDP, compile): not in the fast lane

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


def _error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.strip().splitlines() if not ln.startswith("warning: this machine is busy")]


@needs_joblib
def test_a_launcher_count_without_meaning_fails_the_dry_run_and_the_run_in_one_line(tmp_path) -> None:
    from posenc_cli.errors import ConfigError
    from posenc_cli.sweep.runner import run_sweep
    from posenc_cli.sweep.spec import find_sweep_file, load_sweep_spec

    launcher = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=0"]
    for extra in (["--dry-run"], ["--out", str(tmp_path / "out")]):
        result = runner.invoke(app, ["sweep", "extrapolation", *launcher, *extra], terminal_width=200)
        assert result.exit_code == 2, result.output  # the dry run passed; the run ended in joblib's traceback
        lines = _error_lines(result.stderr)
        assert len(lines) == 1 and "hydra.launcher.n_jobs=0 has no meaning" in lines[0], result.stderr
        assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()
    spec = load_sweep_spec(find_sweep_file("extrapolation", [config_dir()]))
    with pytest.raises(ConfigError, match="n_jobs=0 has no meaning"):  # a caller of the library is checked too
        run_sweep(spec, [], tmp_path / "lib", launcher_overrides=launcher)
    assert not (tmp_path / "lib").exists()


def test_the_dry_run_refuses_a_model_training_would_refuse(tmp_path) -> None:
    """The dry run makes training's own checks (Config.validate and the memory estimate) for every job."""
    for extra in (["--dry-run"], ["--out", str(tmp_path / "out")]):
        result = runner.invoke(app, ["sweep", "extrapolation", "model.d_model=100000", *extra], terminal_width=200)
        assert result.exit_code == 2, result.output  # the dry run listed 7 jobs; the run then refused each one
        lines = _error_lines(result.stderr)
        assert len(lines) == 1 and "model.d_model=100000" in lines[0] and "training needs about" in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_dry_run_listing_tells_every_job_apart_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 80 columns (or piped) the listing cut job names to 'pos=sinusoidal,train.see…': the seeds looked alike."""
    from posenc_cli.cli.app import console

    monkeypatch.setattr(console, "width", 80)  # as COLUMNS=80 gives it (conftest sets COLUMNS=200 for all tests)
    result = runner.invoke(app, ["sweep", "alibi-paper", "--dry-run"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(ln.rstrip()) for ln in lines) <= 80, [ln for ln in lines if len(ln.rstrip()) > 80]
    assert "…" not in result.stdout
    for pos in ("sinusoidal", "rope", "t5", "alibi", "nope", "learned"):
        for seed in (0, 1, 2):
            assert sum(f"pos={pos} train.seed={seed} " in ln for ln in lines) == 1, (pos, seed)
    assert "eval.tokens=8192" in result.stdout  # the overrides every job shares, shown once, wrapped
