"""The schemes whose positions come from the content train from the CLI, resume bitwise after an interruption, and
evaluate beyond the training length: FoX (with and without RoPE) and stick-breaking."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from train_utils import metrics, same_weights, tiny_config, tiny_overrides, weights, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli.app import app
from posenc_cli.run.train import train

SCHEMES = ["fox", "stickbreaking"]
STEPS = dict(steps=10, save_every=4)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def _interrupt_at(step: int):
    def callback(event: dict) -> None:
        if event["event"] == "step" and event["step"] == step:
            os.kill(os.getpid(), signal.SIGTERM)

    return callback


@pytest.mark.parametrize("name", SCHEMES)
def test_interrupted_run_resumes_bitwise(name: str, corpus: Path, tmp_path: Path) -> None:
    cfg = tiny_config(corpus, pos=name, model={"dropout": 0.1}, **STEPS)
    ref, run = tmp_path / "ref", tmp_path / "run"
    train(cfg, ref)
    assert train(cfg, run, callback=_interrupt_at(6)).stopped_reason == "interrupted"
    assert train(cfg, run, resume=True).step == 10
    assert same_weights(weights(run), weights(ref))
    assert metrics(run) == metrics(ref)


@pytest.mark.parametrize("pos", [["pos=fox", "pos.rope=true"], ["pos=stickbreaking"]], ids=["fox-rope", "sb"])
def test_trains_and_evaluates_beyond_the_training_length_from_the_cli(
    pos: list[str], corpus: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    overrides = [o for o in tiny_overrides(corpus, steps=4, eval_every=4, save_every=4) if o != "pos=nope"]
    train_out = CliRunner().invoke(app, ["train", *overrides, *pos, "--out", str(run)])
    assert train_out.exit_code == 0, train_out.output
    ev = CliRunner().invoke(app, ["eval-extrapolate", str(run), "--lengths", "1,4", "--tokens", "256"])
    assert ev.exit_code == 0, ev.output
    assert "4×" in ev.output and "n/a" not in ev.output
