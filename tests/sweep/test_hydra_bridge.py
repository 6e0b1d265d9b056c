"""Hydra's multirun side: launcher settings validated as the launch would, job directory names."""

from __future__ import annotations

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
