"""Two sweeps into one --out (issue #16): while one holds the sweep directory's lock, a second fails at once with one
line on stderr and exit code 2, and changes nothing in the directory (nor in the directory it runs from)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.sweep.runner import SWEEP_LOCK

pytestmark = pytest.mark.integration  # end to end (sweeps, launchers, DDP, compile): not in the fast lane

MICRO_MODEL = "d_model: 16\nn_layer: 1\nn_head: 2\nnorm: layernorm\nmlp_ratio: 2\nbias: true\ndropout: 0.0\n"
TINY_SWEEP = """# posenc sweep tiny --config-dir DIR
overrides: [model=micro, data=text, 'data.paths=[corpus]', train.steps=2, train.warmup_steps=1, train.seq_len=16,
  train.batch_size=2, train.eval_every=2, train.eval_batches=1, train.save_every=2, train.log_every=1,
  train.precision=fp32, train.threads=1, eval.tokens=32, 'eval.lengths=[1]']
stages:
  - name: train
    params: {pos: "alibi"}
"""
# Holds the lock as `posenc_cli.sweep.runner.sweep_lock` takes it (filelock on the same file), from another process.
HOLDER = (
    "import sys, filelock\n"
    "lock = filelock.FileLock(sys.argv[1])  # kept referenced: a collected FileLock releases its lock\n"
    "lock.acquire()\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "corpus").mkdir()
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"]
    for i in range(3):
        (tmp_path / "corpus" / f"doc{i}.txt").write_text(" ".join(words[(i + j * j) % 7] for j in range(300)))
    (tmp_path / "cfg" / "model").mkdir(parents=True)
    (tmp_path / "cfg" / "sweep").mkdir()
    (tmp_path / "cfg" / "model" / "micro.yaml").write_text(MICRO_MODEL)
    (tmp_path / "cfg" / "sweep" / "tiny.yaml").write_text(TINY_SWEEP)
    monkeypatch.chdir(tmp_path)
    # The machine-load warning depends on what else runs here; it is not what this test is about.
    monkeypatch.setattr("posenc_cli.cpu_load.training_busy_warning", lambda *args, **kwargs: None)
    return tmp_path


def sweep(out: str):
    return CliRunner().invoke(app, ["sweep", "tiny", "--config-dir", "cfg", "--out", out], terminal_width=200)


@pytest.fixture
def held_lock(workspace: Path) -> Iterator[Path]:
    """The sweep directory `S`, after one finished sweep, with its lock held by another process."""
    first = sweep("S")
    assert first.exit_code == 0, first.output
    lock = workspace / "S" / SWEEP_LOCK
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield workspace / "S"
    finally:
        holder.communicate(timeout=30)  # closing its stdin releases the lock


def snapshot(root: Path) -> dict[str, tuple[int, bytes] | None]:
    """Every path below `root`: (mtime, contents) of files, None for directories. The lock file's own mtime is left
    out: taking a lock opens the file, which is not a change to the sweep."""
    out: dict[str, tuple[int, bytes] | None] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_dir():
            out[rel] = None
        else:
            out[rel] = (0 if path.name == SWEEP_LOCK else path.stat().st_mtime_ns, path.read_bytes())
    return out


def test_a_second_sweep_into_a_locked_directory_fails_at_once_and_changes_nothing(
    workspace: Path, held_lock: Path
) -> None:
    before = snapshot(workspace)
    assert "S/sweep.json" in before and "S/results.json" in before and "S/train/default/done.json" in before

    result = sweep("S")

    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.stderr
    assert "is in use by another posenc sweep" in lines[0] and str(held_lock.resolve()) in lines[0], lines[0]
    assert snapshot(workspace) == before
