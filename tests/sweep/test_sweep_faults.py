"""A sweep stopped at any moment (SIGTERM or SIGKILL; in training, evaluation or extension) and run again ends with
exactly the results of an uninterrupted sweep (issue #16): a job is done only by its marker, written last.

The stops come from a child process that signals itself at a chosen moment: `sweep_fault.py` wraps what the job
module calls (training, the extension, the evaluation and its progress reports) and runs the sweep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sweep_utils import MICRO_MODEL, TWO_STAGES
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.sweep.markers import DONE_FILE, job_status

pytestmark = pytest.mark.integration  # end to end (sweeps, launchers, DDP, compile): not in the fast lane

FAULT_SCRIPT = Path(__file__).with_name("sweep_fault.py")
JOBS = ("train/pos=rope", "train/pos=alibi", "extend/pos=rope/default")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("faults")
    (root / "corpus").mkdir()
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda"]
    for i in range(6):
        (root / "corpus" / f"doc{i}.txt").write_text(" ".join(words[(i * 7 + j * j) % 11] for j in range(600)))
    (root / "cfg" / "model").mkdir(parents=True)
    (root / "cfg" / "sweep").mkdir()
    (root / "cfg" / "model" / "micro.yaml").write_text(MICRO_MODEL)
    (root / "cfg" / "sweep" / "two.yaml").write_text(TWO_STAGES)
    return root


def sweep_in_process(workspace: Path, out: str) -> tuple[int, str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(workspace)
        result = CliRunner().invoke(app, ["sweep", "two", "--config-dir", "cfg", "--out", out], terminal_width=200)
    return result.exit_code, result.output


def sweep_with_fault(workspace: Path, out: str, fault: str) -> subprocess.CompletedProcess[str]:
    """The same sweep in a child process that sends itself a signal at the point `fault` names."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(FAULT_SCRIPT), fault, "sweep", "two", "--config-dir", "cfg", "--out", out]
    return subprocess.run(command, cwd=workspace, env=env, capture_output=True, text=True, timeout=300)


def outcome(sweep_dir: Path) -> dict[str, bytes]:
    """What must not depend on interruptions: the results files and every job's weights, byte for byte."""
    name_in_paths = f"{sweep_dir.name}/".encode()  # rows name their run directory; only the sweep's name differs
    files = {n: (sweep_dir / n).read_bytes().replace(name_in_paths, b"SWEEP/") for n in ("results.json", "results.csv")}
    rows = json.loads(files["results.json"])
    files["results.json"] = json.dumps([{k: v for k, v in r.items() if k != "created"} for r in rows]).encode()
    files |= {job: (sweep_dir / job / "model.safetensors").read_bytes() for job in JOBS}
    return files


@pytest.fixture(scope="module")
def reference(workspace: Path) -> dict[str, bytes]:
    code, output = sweep_in_process(workspace, "reference")
    assert code == 0, output
    return outcome(workspace / "reference")


def test_sigterm_in_training_stops_the_sweep_unevaluated_and_a_rerun_resumes(workspace: Path, reference) -> None:
    proc = sweep_with_fault(workspace, "term", "train:2:TERM:pos=rope")
    assert proc.returncode == 128 + 15, proc.stderr
    assert "interrupted by SIGTERM: train/pos=rope" in proc.stderr and "Resume with: posenc sweep two" in proc.stderr
    assert "Traceback" not in proc.stderr
    rope = workspace / "term" / "train/pos=rope"
    meta = json.loads((rope / "meta.json").read_text())
    assert (meta["status"], meta["step"]) == ("interrupted", 2)
    assert job_status(rope) == "interrupted"
    assert not (rope / "eval").exists() and not (rope / DONE_FILE).exists()  # a half-trained model is not scored
    assert not (workspace / "term" / "train/pos=alibi" / "meta.json").exists()  # later jobs did not start
    assert not (workspace / "term" / "results.json").exists()

    code, output = sweep_in_process(workspace, "term")
    assert code == 0, output
    assert json.loads((rope / "meta.json").read_text())["status"] == "complete"
    assert outcome(workspace / "term") == reference


def test_sigterm_at_the_last_training_step_stops_the_sweep_too(workspace: Path, reference) -> None:
    """Training completes the step a signal arrives in; at the last one it then saves the run complete. The sweep
    must still stop (it exited 0 and went on with every later job), unevaluated, and say how to resume."""
    proc = sweep_with_fault(workspace, "last", "train:4:TERM:pos=rope")  # the sweep trains 4 steps
    assert proc.returncode == 128 + 15, proc.stdout[-2000:] + proc.stderr
    assert "interrupted by SIGTERM: train/pos=rope" in proc.stderr and "Resume with: posenc sweep two" in proc.stderr
    rope = workspace / "last" / "train/pos=rope"
    assert json.loads((rope / "meta.json").read_text())["status"] == "complete"
    assert job_status(rope) == "partial" and not (rope / "eval").exists()
    assert not (workspace / "last" / "train/pos=alibi" / "meta.json").exists()  # later jobs did not start
    code, output = sweep_in_process(workspace, "last")
    assert code == 0, output
    assert outcome(workspace / "last") == reference


def test_kills_in_training_evaluation_and_extension_then_rerun_give_the_same_results(
    workspace: Path, reference
) -> None:
    out = workspace / "kills"
    for fault in ("train:3:KILL:pos=alibi", "eval:2:KILL:pos=alibi", "eval:1:TERM:extend"):
        proc = sweep_with_fault(workspace, "kills", fault)
        if fault.endswith("TERM:extend"):  # stops the evaluation, says how to resume (it was killed by the signal)
            assert proc.returncode == 128 + 15, (fault, proc.returncode, proc.stderr[-2000:])
            assert "interrupted by SIGTERM: extend/pos=rope/default" in proc.stderr and "Resume with" in proc.stderr
        else:
            assert proc.returncode < 0, (fault, proc.returncode, proc.stderr[-2000:])  # killed by the signal
    # The last kill came during the extension's evaluation: its cells are partly stored, the job is not done.
    assert job_status(out / "extend/pos=rope/default") == "partial"
    assert all(job_status(out / job) == "done" for job in JOBS[:2])
    code, output = sweep_in_process(workspace, "kills")
    assert code == 0, output
    assert "stage train: all 2 job(s) already done" in output
    assert outcome(out) == reference
    assert not any(r["status"] != "ok" for r in json.loads((out / "results.json").read_text()))
