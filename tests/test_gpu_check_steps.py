"""benchmarks/gpu-check.sh --only: a subset of its steps, each name checked before anything runs; and the JSON
record of compile_step.py that its summary reads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu-check.sh"
BASH = shutil.which("bash")


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}  # hide any GPU: the skip path
    return subprocess.run([BASH or "bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.skipif(BASH is None, reason="needs bash")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--only", "sweep-share,bogus"), "unknown step bogus (steps: cuda-tests test-suite"),
        (("--only",), "--only needs step names"),
        (("--only", ""), "--only needs step names"),
    ],
)
def test_only_refuses_unknown_steps(args: tuple[str, ...], message: str) -> None:
    done = run(*args)
    assert done.returncode == 2 and message in done.stderr and done.stdout == ""


@pytest.mark.integration  # the script in a subprocess
@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_only_known_steps_skip_cleanly_without_a_gpu() -> None:
    done = run("--only", "compile-step,sweep-share", "--check")
    assert done.returncode == 0 and "no GPU: skipped" in done.stdout


@pytest.mark.integration  # end to end
def test_compile_step_writes_what_the_summary_reads(tmp_path: Path) -> None:
    out = tmp_path / "compile.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "compile_step.py"), "--modes", "eager", "--device", "cpu"]
    cmd += ["--threads", "1", "--precision", "fp32", "--rounds", "1", "--round-s", "0.01", "--warmup", "1"]
    cmd += ["--json", str(out), "model.n_layer=1", "train.batch_size=2", "train.seq_len=16"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())["results"]
    assert list(results) == ["eager"] and results["eager"]["speed_vs_eager"] == 1.0
    assert results["eager"]["ms_per_step"] > 0 and "eager" in done.stdout
