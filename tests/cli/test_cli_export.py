"""`posenc export` through Typer's CliRunner: a verified export, and refusals with exit code 2 that write nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.run.train import train

pytest.importorskip("transformers", reason="posenc export --to hf needs transformers")

runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli-export")
    corpus = write_corpus(root)
    out = {}
    for pos in ("learned", "alibi"):
        out[pos] = root / pos
        train(tiny_config(corpus, pos=pos, steps=2), out[pos])
    return out


def invoke(*args: str):
    return runner.invoke(app, ["export", *args], env={"COLUMNS": "200"})


def test_export_learned_run_prints_architecture_and_check(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "hf"
    result = invoke(str(runs["learned"]), "--to", "hf", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "GPT2LMHeadModel" in result.output and "up to 16 positions" in result.output
    assert "verified: max |Δlogit|" in result.output
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}


def test_alibi_is_refused_with_exit_2_and_nothing_written(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "hf"
    result = invoke(str(runs["alibi"]), "--out", str(out))
    assert result.exit_code == 2
    assert "not exportable: no matching architecture in transformers" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_non_empty_output_and_unknown_format_are_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    result = invoke(str(runs["learned"]), "--out", str(tmp_path / "busy"))
    assert result.exit_code == 2 and "not empty" in result.output
    result = invoke(str(runs["learned"]), "--to", "onnx", "--out", str(tmp_path / "new"))
    assert result.exit_code == 2 and "--to onnx is not supported" in result.output
    result = invoke(str(tmp_path / "nowhere"), "--out", str(tmp_path / "new"))
    assert result.exit_code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]


def test_help_has_an_example() -> None:
    result = runner.invoke(app, ["export", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "posenc export outputs/runs/rope --to hf --out" in result.output


def test_help_says_what_exports_today() -> None:
    """RMSNorm RoPE runs and layouts export as SmolLM3 (run/export_smollm3.py); the help once said they were refused."""
    result = runner.invoke(app, ["export", "--help"], env={"COLUMNS": "400"})
    text = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 0 and "SmolLM3" in text and "model.norm=rmsnorm" in text
    assert "model.norm=rmsnorm, have no matching" not in text


def test_the_exported_directory_and_files_get_the_usual_modes(runs: dict[str, Path], tmp_path: Path) -> None:
    import os
    import stat

    old = os.umask(0o022)
    try:
        result = invoke(str(runs["learned"]), "--out", str(tmp_path / "hf"))
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE((tmp_path / "hf").stat().st_mode) == 0o755  # mkdtemp's 0o700 made it private
    assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "hf").iterdir()} == {0o644}
