"""Hostile inputs to `posenc extend` through Typer's CliRunner: factors out of every method's range and hostile
`--factors` files. Each is one line, exit 2, no traceback, nothing written."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.rope_scaling import registry
from posenc_cli.run.train import train

runner = CliRunner()
PAIRS = 8  # tiny runs: head dim 16


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli-extend-hostile")
    train(tiny_config(write_corpus(root), pos="rope", steps=1), root / "rope")
    return root / "rope"


def refused(rope_run: Path, tmp_path: Path, *args: str) -> str:
    """The one line `extend RUN *args` printed (exit 2, nothing written); fails otherwise."""
    out = tmp_path / "child"
    result = runner.invoke(app, ["extend", str(rope_run), *args, "--out", str(out)], env={"COLUMNS": "200"})
    assert result.exit_code == 2, (result.output, result.exception)
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not out.exists()
    return " ".join(result.output.split())


@pytest.mark.parametrize("method", sorted(registry()))
@pytest.mark.parametrize("factor", ["1e308", "1e12"])
def test_a_huge_factor_is_refused_for_every_method(rope_run: Path, tmp_path: Path, method: str, factor: str) -> None:
    extra = ["--long-factor", "2"] * PAIRS if method == "longrope" else []
    message = refused(rope_run, tmp_path, "--method", method, "--factor", factor, *extra)
    assert f"--factor {float(factor):g} is out of range for {method}" in message


@pytest.mark.parametrize("factor", ["1e308", "1e12"])
def test_a_huge_factor_is_refused_before_the_search(rope_run: Path, tmp_path: Path, factor: str) -> None:
    assert "is out of range for longrope" in refused(rope_run, tmp_path, "--search", "--factor", factor)


def factors_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "factors.json"
    path.write_text(text)
    return path


def test_factors_of_1e308_are_refused(rope_run: Path, tmp_path: Path) -> None:
    path = factors_file(tmp_path, json.dumps({"short_factor": [1.0] * PAIRS, "long_factor": [1e308] * PAIRS}))
    message = refused(rope_run, tmp_path, "--factors", str(path), "--factor", "4")
    assert "LongRoPE's factors (up to 1e+308) at --factor 4 are out of range" in message


@pytest.mark.parametrize("digits", [5001, 4000])
def test_a_factor_of_thousands_of_digits_is_refused(rope_run: Path, tmp_path: Path, digits: int) -> None:
    long = ",".join(["1" + "0" * (digits - 1)] * PAIRS)
    path = factors_file(tmp_path, f'{{"short_factor": [{",".join(["1"] * PAIRS)}], "long_factor": [{long}]}}')
    message = refused(rope_run, tmp_path, "--factors", str(path), "--factor", "4")
    assert str(path) in message and ("not valid JSON" in message or "too large for a float" in message)


def test_deeply_nested_factors_json_is_refused(rope_run: Path, tmp_path: Path) -> None:
    path = factors_file(tmp_path, "[" * 200_000 + "]" * 200_000)
    assert "nested deeper than 4 levels" in refused(rope_run, tmp_path, "--factors", str(path))


def test_dev_zero_is_refused_unread(rope_run: Path, tmp_path: Path) -> None:
    assert "is not a regular file" in refused(rope_run, tmp_path, "--factors", "/dev/zero")


def test_a_big_factors_file_is_refused_unread(rope_run: Path, tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(64 * 2**20)  # sparse: 64 MiB of zeros
    assert "big.json" in refused(rope_run, tmp_path, "--factors", str(path))


def test_a_fifo_is_refused_without_hanging(rope_run: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "factors.fifo"
    os.mkfifo(fifo)
    done: list[str] = []
    worker = threading.Thread(target=lambda: done.append(refused(rope_run, tmp_path, "--factors", str(fifo))))
    worker.start()
    worker.join(timeout=30)
    if worker.is_alive():  # unblock the reader so the test run ends, then fail
        with open(fifo, "w") as w:
            w.write("{}")
        worker.join()
        pytest.fail("extend --factors FIFO blocked")
    assert done and "is not a regular file" in done[0]
