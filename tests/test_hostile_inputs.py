"""Faults through the CLI: a full or read-only disk, unavailable devices, hostile or broken run directories and
bad values each end in one line on stderr and exit code 2, and nothing of the user's is touched."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from train_utils import tiny_config, tiny_overrides, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.train import train

runner = CliRunner()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("hostile-corpus"))


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Path:
    run = tmp_path_factory.mktemp("hostile-runs") / "rope"
    train(tiny_config(corpus, pos="rope", steps=2), run)
    return run


def one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


# -- devices ---------------------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_eval_device_cuda_names_the_flag_given(rope_run: Path) -> None:
    result = runner.invoke(app, ["eval-extrapolate", str(rope_run), "--device", "cuda", "--lengths", "1"])
    one_line_error(result, "--device cuda but CUDA is not available")
    assert "train.device" not in result.stderr


# -- storage ---------------------------------------------------------------------------------------------------


def _refuse_writes(monkeypatch: pytest.MonkeyPatch, module: str, name: str, code: int) -> None:
    def fail(path, *args, **kwargs):
        raise OSError(code, "simulated", str(path))

    monkeypatch.setattr(f"{module}.{name}", fail)


def test_full_disk_in_train_is_one_line_naming_the_path(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _refuse_writes(monkeypatch, "posenc_cli.checkpoint", "atomic_write_bytes", errno.ENOSPC)
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", *tiny_overrides(corpus, steps=2), "--out", str(out)])
    one_line_error(result, "No space left on device", str(out / ".pending"))


def test_eval_on_read_only_storage_still_scores(rope_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _refuse_writes(monkeypatch, "posenc_cli.evaluate", "save_results", errno.EROFS)
    result = runner.invoke(app, ["eval-extrapolate", str(rope_run), "--lengths", "1,2", "--tokens", "64"])
    assert result.exit_code == 0, result.output
    assert "Read-only file system" in result.stderr and "not cached" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "1 run(s) evaluated" in result.stdout


def test_eval_json_on_a_full_disk_is_one_line(rope_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _refuse_writes(monkeypatch, "posenc_cli.fsutil", "atomic_write_json", errno.ENOSPC)
    target = tmp_path / "all.json"
    args = ["eval-extrapolate", str(rope_run), "--lengths", "1", "--tokens", "64", "--json", str(target)]
    result = runner.invoke(app, args)
    one_line_error(result, "No space left on device", str(target))
