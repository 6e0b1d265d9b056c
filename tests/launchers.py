"""Skip markers for tests that need Hydra's launcher plugins (the `launchers` extra, part of `dev`)."""

from __future__ import annotations

import importlib.util

import pytest


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:  # the hydra_plugins namespace itself is absent
        return True


needs_joblib = pytest.mark.skipif(
    _missing("hydra_plugins.hydra_joblib_launcher"),
    reason="needs hydra-joblib-launcher (pip install 'posenc[launchers]')",
)
needs_submitit = pytest.mark.skipif(
    _missing("hydra_plugins.hydra_submitit_launcher"),
    reason="needs hydra-submitit-launcher (pip install 'posenc[launchers]')",
)
