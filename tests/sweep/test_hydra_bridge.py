"""Hydra's multirun side: launcher settings validated as the launch would, job directory names."""

from __future__ import annotations

from pathlib import Path

import pytest
from launchers import needs_joblib, needs_submitit

from posenc_cli.errors import ConfigError

pytestmark = pytest.mark.integration  # end to end (sweeps, launchers, DDP, compile): not in the fast lane


@needs_joblib
@needs_submitit
def test_launcher_settings_validate_name_and_keys_like_the_launch() -> None:
    from posenc_cli.sweep.hydra_bridge import launcher_settings

    assert launcher_settings([]) == ("basic", {})
    assert launcher_settings(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]) == ("joblib", {"n_jobs": 2})
    slurm = ["hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu"]
    assert launcher_settings(slurm) == ("submitit_slurm", {"partition": "gpu"})
    with pytest.raises(ConfigError, match=r"unknown launcher hydra/launcher=submitit_slrum \(did you mean submitit_s"):
        launcher_settings(["hydra/launcher=submitit_slrum"])
    with pytest.raises(ConfigError, match=r"unknown launcher key 'hydra.launcher.partiton' \(did you mean partition"):
        launcher_settings(["hydra/launcher=submitit_slurm", "hydra.launcher.partiton=gpu"])


def test_a_job_with_a_long_name_runs_in_its_shortened_directory(tmp_path: Path, monkeypatch) -> None:
    """Hydra names a job's directory through `short_name` as the plan does: a swept override of > 255 bytes (here a
    long path list) runs, in the directory the plan names, and compare finds it."""
    from sweep_utils import COMMON, MICRO_MODEL
    from typer.testing import CliRunner

    from posenc_cli.cli import app
    from posenc_cli.sweep.hydra_bridge import MAX_NAME_BYTES

    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text(" ".join(f"word{i % 13}" for i in range(3000)))
    (tmp_path / "cfg" / "model").mkdir(parents=True)
    (tmp_path / "cfg" / "sweep").mkdir()
    (tmp_path / "cfg" / "model" / "micro.yaml").write_text(MICRO_MODEL)
    paths = ",".join(["corpus"] * 40)  # the same directory 40 times: a name of 292 bytes
    (tmp_path / "cfg" / "sweep" / "long.yaml").write_text(
        f'overrides: {COMMON}\nstages:\n  - name: train\n    params: {{data.paths: "[corpus],[{paths}]"}}\n'
    )
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["sweep", "long", "--config-dir", "cfg", "--out", "out"])
    assert result.exit_code == 0, result.output
    names = sorted((p.name for p in (tmp_path / "out" / "train").iterdir() if p.is_dir()), key=len)
    assert names[0] == "data.paths=[corpus]" and len(names) == 2
    assert names[1].startswith("data.paths=[corpus,corpus,") and len(names[1].encode()) == MAX_NAME_BYTES
    assert all((tmp_path / "out" / "train" / name / "done.json").is_file() for name in names)
