"""`posenc calibrate` through Typer's CliRunner: the child it writes is what `eval-extrapolate CHILD` evaluates with
the fitted temperature; refusals exit 2 with one line and write nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

import posenc_cli.cli.calibrate  # noqa: F401  (registers the command; see the report: cli/__init__ lists modules)
from posenc_cli.cli import app
from posenc_cli.run.load import load_run
from posenc_cli.run.train import train

runner = CliRunner()
FAST = ["--tokens", "128", "--step", "0.5", "--c-max", "1", "--refine", "2"]


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli-calibrate")
    train(tiny_config(write_corpus(root), pos="nope", steps=6), root / "nope")
    return root / "nope"


def invoke(*args: object):
    return runner.invoke(app, [*map(str, args)], env={"COLUMNS": "200"})


def test_calibrate_drope_then_evaluate_the_child(parent: Path, tmp_path: Path) -> None:
    out = tmp_path / "child"
    result = invoke("calibrate", parent, "--temperature", "drope", "--length", "4x", "--out", out, *FAST)
    assert result.exit_code == 0, result.output
    c = load_run(out).config.model.temperature_c
    assert f"DroPE c = {c:g}" in result.output and "eval-extrapolate" in result.output
    again = invoke("calibrate", parent, "--temperature", "drope", "--length", "4x", "--out", out, *FAST)
    assert again.exit_code == 0 and "already there" in again.output
    doc = tmp_path / "eval.json"
    evaluated = invoke("eval-extrapolate", out, "--lengths", "1,4", "--tokens", 64, "--json", doc)
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads(doc.read_text())["runs"][0]["path"].endswith("child")


def test_calibrate_head_scale_default_out(parent: Path) -> None:
    result = invoke("calibrate", parent, "--temperature", "head-scale", "--length", "2x", "--steps", 3, "--tokens", 64)
    assert result.exit_code == 0, result.output
    assert "layer 1 λ:" in result.output
    assert load_run(parent.with_name("nope-head-scalex2")).config.model.attn_scale == "head-scale"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--length", "1x"], "must exceed the training length"),
        (["--length", "lots"], "multiple of the training length"),
        (["--temperature", "ssmax"], "calibrate fits drope or head-scale"),
        (["--form", "token"], "per cell or per query"),
        (["--c-min", "1", "--c-max", "1"], "need 0 < step <= c-max - c-min"),
    ],
)
def test_refusals_are_one_line_exit_2(parent: Path, tmp_path: Path, args: list[str], message: str) -> None:
    result = invoke("calibrate", parent, "--out", tmp_path / "x", *args)
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output and not (tmp_path / "x").exists()


def test_a_best_c_at_an_end_of_the_search_is_printed_as_that_edge(tmp_path: Path) -> None:
    from posenc_cli.cli.calibrate import summary_lines
    from posenc_cli.extension.calibrate import CalibrateResult

    result = CalibrateResult(tmp_path, tmp_path / "c", "created", "drope", 16, [64], c=-0.5, c_range=[-0.5, 2.0])
    result.at_edge = True
    text = "\n".join(summary_lines(result))
    assert "c = -0.5 is the lower edge of the search [-0.5, 2]: a bound, not a minimum; widen --c-min" in text
    result.c, result.at_edge = 0.0, False
    assert "neither sign of c lowers the loss" in "\n".join(summary_lines(result))
    result.c, result.form = -0.15, "query"
    assert "DroPE c = -0.15 per query: β(4×)=0.7921" in "\n".join(summary_lines(result))


@pytest.fixture(scope="module")
def refused(parent: Path) -> Path:
    """Beside `parent`: a run trained with a temperature (logn), one stopped mid-way, a transformers directory and
    an empty directory."""
    root = parent.parent
    train(tiny_config(root / "corpus.txt", pos="nope", steps=2, model={"attn_scale": "logn"}), root / "logn")
    shutil.copytree(parent, root / "unfinished")
    meta = json.loads((root / "unfinished" / "meta.json").read_text())
    (root / "unfinished" / "meta.json").write_text(json.dumps({**meta, "status": "interrupted", "step": 2}))
    (root / "hf").mkdir()
    (root / "hf" / "config.json").write_text("{}")
    (root / "empty").mkdir()
    return root


@pytest.mark.parametrize(
    ("run", "args", "message"),
    [
        ("missing", [], "run directory {root}/missing does not exist"),
        ("hf", [], "{root}/hf is a transformers directory; calibrate fits posenc runs"),
        ("empty", [], "{root}/empty is not a posenc run directory (no meta.json)"),
        ("unfinished", [], "{root}/unfinished is incomplete (training stopped at step 2 of 6); resume it with"),
        ("logn", [], "{root}/logn already has a temperature (model.attn_scale=logn)"),
        ("nope", ["--out", "{root}/nope"], "the output directory is the parent run {root}/nope; extend never"),
        ("nope", ["--length", "1x"], "--length 16: the fit length must exceed the training length 16"),
        ("nope", ["--length", "lots"], "--length lots: give a multiple of the training length (4x) or tokens"),
        ("nope", ["--temperature", "ssmax"], "--temperature ssmax: calibrate fits drope or head-scale"),
        ("nope", ["--form", "token"], "--form token: DroPE's temperature is applied per cell or per query"),
        ("nope", ["--c-min", "-2", "--c-max", "-1"], "--c-min -2.0 .. --c-max -1.0: no c keeps β > 0 at the fit"),
        ("nope", ["--temperature", "head-scale", "--length", "2x", "--length", "4x"], "head-scale is trained at one"),
    ],
)
def test_a_refusal_that_needs_no_checkpoint_is_one_line_before_torch(
    refused: Path, run: str, args: list[str], message: str
) -> None:
    """What the flags and the parent's meta.json and config.yaml decide exits 2 with one line, without importing
    torch (seconds): `-X importtime` lists every module imported on stderr, before the error line."""
    root = refused
    flags = [arg.format(root=root) for arg in args]
    cmd = [sys.executable, "-X", "importtime", "-m", "posenc_cli", "calibrate", str(root / run), *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=root)
    lines = done.stderr.splitlines()
    imported = [line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")]
    said = [line for line in lines if not line.startswith("import time:")]
    assert done.returncode == 2 and done.stdout == "", done.stderr[-2000:]
    assert len(said) == 1 and said[0].startswith("error: " + message.format(root=root)), said
    assert "posenc_cli.extension.calibrate_settings" in imported  # the checks ran
    assert not [name for name in imported if name == "torch" or name.startswith("torch.")]
