"""`posenc export` refuses per-layer layouts (pos=irope|rnope-swa|smollm3|gemma3|layout) in one line, exit 2,
nothing written: no transformers architecture holds posenc's GPT-2-shaped block with per-layer spans or NoPE layers
(Gemma 3, Qwen2, Mistral, SmolLM3 and Llama 4 use RMSNorm and gated MLPs without biases; Cohere 2, the one with a
mean-subtracting norm and NoPE global layers, adds attention and MLP in parallel)."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

pytest.importorskip("transformers")

from posenc_cli.cli import app
from posenc_cli.run.train import train

PRESETS = ["irope", "rnope-swa", "smollm3", "gemma3"]


def _run(root: Path, preset: str) -> Path:
    """A one-step run of `preset`, one period of its pattern deep (Gemma 3: 6 layers, the others 4)."""
    root.mkdir()
    corpus = write_corpus(root)
    model = {"n_layer": 6 if preset == "gemma3" else 4}
    train(tiny_config(corpus, pos=preset, model=model, steps=1, eval_every=1, save_every=1), root / "run")
    return root / "run"


@pytest.mark.parametrize("preset", PRESETS)
def test_a_layout_preset_is_refused_in_one_line_and_nothing_is_written(tmp_path: Path, preset: str) -> None:
    run = _run(tmp_path / "src", preset)
    before = sorted(p.name for p in run.rglob("*"))
    out = tmp_path / "out" / "exported"
    result = CliRunner().invoke(app, ["export", str(run), "--out", str(out)], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert f"no matching architecture in transformers for pos={preset}" in result.output
    assert "Traceback" not in result.output and not out.parent.exists()  # no temporary directory beside --out
    assert sorted(p.name for p in run.rglob("*")) == before
