"""Hostile paths as the run/sweep directory argument of every command that reads one: a FIFO (whose open blocks) and
/dev/zero (endless) are refused in one line, exit 2, before anything reads them. Each case runs in its own process
under a timeout, so a command that did read one fails the test instead of hanging the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = [
    ["compare", "{path}"],
    ["eval-extrapolate", "{path}", "--lengths", "1"],
    ["eval-passkey", "{path}"],
    ["eval-tasks", "{path}"],
    ["eval-algorithmic", "{path}"],
    ["extend", "{path}", "--yarn", "--factor", "2", "--out", "{out}"],
    ["calibrate", "{path}", "--out", "{out}"],
    ["export", "{path}", "--out", "{out}"],
    ["viz", "attention", "{path}"],
]


@pytest.fixture(scope="module")
def fifo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fifo") / "pipe"
    os.mkfifo(path)
    return path


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0] if a[0] != "viz" else "viz-attention")
def test_a_hostile_path_is_refused_in_one_line(args: list[str], kind: str, fifo: Path, tmp_path: Path) -> None:
    path = str(fifo) if kind == "fifo" else "/dev/zero"
    out = tmp_path / "out"
    argv = [a.format(path=path, out=out) for a in args]
    code = "from posenc_cli.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 2, (argv, result.returncode, result.stderr[-2000:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in result.stderr, result.stderr
    assert not out.exists()
