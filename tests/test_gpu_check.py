"""benchmarks/gpu-check.sh: valid bash, and a clean skip (exit 0) where torch sees no GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu-check.sh"
BASH = shutil.which("bash")

pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}  # hide any GPU: the skip path
    return subprocess.run([BASH, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env)


def test_script_is_valid_bash() -> None:
    done = subprocess.run([BASH, "-n", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.integration  # the script in a subprocess
@pytest.mark.parametrize("args", [(), ("--check",)])
def test_without_a_gpu_it_skips_cleanly(args: tuple[str, ...]) -> None:
    done = run(*args)
    assert done.returncode == 0, done.stderr
    assert "no GPU: skipped" in done.stdout
    assert done.stderr == ""


def test_unknown_argument_is_refused() -> None:
    done = run("--bogus")
    assert done.returncode == 2 and "unknown argument --bogus" in done.stderr
