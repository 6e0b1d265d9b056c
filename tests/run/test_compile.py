"""`train.compile`: compiled training steps give the eager losses (fp32), resume exactly, and refuse in one line
where torch.compile cannot work. Most tests compile with Dynamo's "eager" backend (its graph capture, no code
generation: seconds); slow tests compile with AOTAutograd ("aot_eager") and with TorchInductor itself."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from train_utils import metrics, same_weights, tiny_config, tiny_overrides, weights, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.errors import ConfigError
from posenc_cli.run import compile as compiling
from posenc_cli.run.train import train

pytestmark = pytest.mark.integration  # end to end (sweeps, launchers, DDP, compile): not in the fast lane

runner = CliRunner()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def dynamo(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Compile with Dynamo's "eager" backend (its graph capture, the captured graphs run by eager kernels: fast),
    and record each torch.compile mode asked for (proof that compilation happened)."""
    modes: list[str] = []
    real = torch.compile

    def spy(model: Any, **kwargs: Any) -> Any:
        modes.append(kwargs["mode"])
        return real(model, **kwargs)

    monkeypatch.setattr(compiling, "BACKEND", "eager")
    monkeypatch.setattr(torch, "compile", spy)
    return modes


def _close(a: list[tuple], b: list[tuple], tol: float) -> bool:
    """Same steps and tokens; losses and learning rates equal to `tol` (relative)."""
    for ra, rb in zip(a, b, strict=True):
        for x, y in zip(ra, rb, strict=True):
            if (x is None) != (y is None) or (x is not None and not math.isclose(x, y, rel_tol=tol, abs_tol=tol)):
                return False
    return True


def test_compiled_steps_give_the_eager_losses(corpus: Path, tmp_path: Path, dynamo: list[str]) -> None:
    """train.random_positions: the compiled forward takes position ids (the warm-up traces that call)."""
    events: list[dict] = []
    common: dict[str, Any] = dict(pos="rope", steps=4, eval_every=2, random_positions=64)
    eager = train(tiny_config(corpus, **common), tmp_path / "eager")
    compiled = train(tiny_config(corpus, compile=True, **common), tmp_path / "compiled", callback=events.append)
    assert dynamo == ["default"]
    assert metrics(tmp_path / "compiled") == metrics(tmp_path / "eager")
    assert compiled.val_loss == eager.val_loss  # validation stays eager
    start = next(e for e in events if e["event"] == "start")
    assert start["compile"] == "compiled (default)"
    assert yaml.safe_load((tmp_path / "compiled" / "config.yaml").read_text())["train"]["compile"] is True


def test_a_compiled_run_resumes_bitwise(
    corpus: Path, tmp_path: Path, dynamo: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dropout and gradient accumulation: the warm-up compile must leave every random stream as it was. As if on
    CUDA, where reduce-overhead records CUDA graphs: a new graph iteration per optimizer step, not per micro-batch."""
    marks: list[int] = []
    monkeypatch.setattr(compiling, "uses_cuda_graphs", lambda value, device: value == "reduce-overhead")
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    cfg = tiny_config(corpus, model={"dropout": 0.1}, steps=6, save_every=2, grad_accum=2, compile="reduce-overhead")
    train(cfg, tmp_path / "whole")
    assert len(marks) == 3 + 6  # three warm-up calls, then one per step

    def stop_at_3(event: dict) -> None:
        if event["event"] == "step" and event["step"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    assert train(cfg, tmp_path / "run", callback=stop_at_3).stopped_reason == "interrupted"
    assert train(cfg, tmp_path / "run", resume=True).step == 6
    assert dynamo == ["reduce-overhead"] * 3
    assert same_weights(weights(tmp_path / "run"), weights(tmp_path / "whole"))
    assert metrics(tmp_path / "run") == metrics(tmp_path / "whole")


def test_eager_is_the_default_and_compiles_nothing(corpus: Path, tmp_path: Path, dynamo: list[str]) -> None:
    events: list[dict] = []
    train(tiny_config(corpus, steps=1), tmp_path / "run", callback=events.append)
    assert dynamo == [] and next(e for e in events if e["event"] == "start")["compile"] == "eager"


@pytest.mark.parametrize(("value", "mode"), [(False, None), (True, "default"), ("reduce-overhead", "reduce-overhead")])
def test_compile_mode(value: bool | str, mode: str | None) -> None:
    assert compiling.compile_mode(value) == mode


def test_cuda_graph_modes_mark_steps_only_on_cuda() -> None:
    assert compiling.uses_cuda_graphs("reduce-overhead", torch.device("cuda"))
    assert not compiling.uses_cuda_graphs("reduce-overhead", torch.device("cpu"))
    assert not compiling.uses_cuda_graphs(True, torch.device("cuda"))


def test_an_unknown_mode_is_one_line(corpus: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", *tiny_overrides(corpus, compile="fast"), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert [line for line in result.stderr.splitlines() if not line.startswith("warning:")] == [
        "error: train.compile='fast' is not one of false, true, default, reduce-overhead, max-autotune, "
        "max-autotune-no-cudagraphs"
    ]
    assert not (tmp_path / "r").exists()


def test_without_a_cxx_compiler_compile_is_refused_before_anything_is_written(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compiling, "cxx_compiler", lambda: None)
    out = tmp_path / "r"
    result = runner.invoke(app, ["train", *tiny_overrides(corpus, compile=True), "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if not line.startswith("warning:")]  # not a busy machine's
    assert len(lines) == 1 and "train.compile=true needs a C++ compiler" in lines[0]
    assert "Traceback" not in result.output
    assert not out.exists()
    assert runner.invoke(app, ["train", *tiny_overrides(corpus, steps=1), "--out", str(out)]).exit_code == 0  # eager


def test_a_compiler_failure_is_one_line_and_leaves_no_run(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(gm: Any, example_inputs: Any) -> Any:
        raise RuntimeError("cc1plus: fatal error: Python.h: No such file or directory")

    monkeypatch.setattr(compiling, "BACKEND", broken)
    out = tmp_path / "r"
    with pytest.raises(ConfigError, match=r"train.compile=true: torch.compile failed on this machine \(.*Python.h"):
        train(tiny_config(corpus, steps=2, compile=True), out)
    assert not out.exists()  # the fresh run's claim is taken back: nothing was trained


@pytest.mark.parametrize(
    ("backend", "precision", "tol"),
    [("aot_eager", "fp32", 1e-5), ("inductor", "fp32", 1e-5), ("inductor", "bf16", 1e-2)],
)
def test_compiled_backends_match_eager(
    backend: str, precision: str, tol: float, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AOTAutograd's traced backward, then TorchInductor's generated kernels (whose fused CPU loops reorder float
    sums, and in bf16 round where eager rounds otherwise): fp32 to 1e-5 over a few steps (measured: 1e-7 for
    Inductor, identical for aot_eager), bf16 autocast to 1e-2 (bf16 keeps 8 bits of mantissa: 4e-3 relative)."""
    if backend == "inductor" and compiling.cxx_compiler() is None:
        pytest.skip("TorchInductor needs a C++ compiler")
    monkeypatch.setattr(compiling, "BACKEND", backend)
    common: dict[str, Any] = dict(pos="rope", steps=4, eval_every=2, precision=precision)
    train(tiny_config(corpus, **common), tmp_path / "eager")
    train(tiny_config(corpus, compile=True, **common), tmp_path / "compiled")
    assert _close(metrics(tmp_path / "eager"), metrics(tmp_path / "compiled"), tol)


def test_on_cuda_without_triton_compile_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiling, "cxx_compiler", lambda: "/usr/bin/g++")
    monkeypatch.setattr(compiling, "has_triton", lambda: False)
    with pytest.raises(ConfigError, match=r"^train.compile=reduce-overhead on CUDA needs the triton package"):
        compiling.check_compile("reduce-overhead", torch.device("cuda"))
    compiling.check_compile("reduce-overhead", torch.device("cpu"))  # Inductor's CPU code needs no triton
    compiling.check_compile(False, torch.device("cuda"))  # eager needs nothing
