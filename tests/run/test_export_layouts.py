"""`posenc export` on per-layer layouts: RMSNorm runs of `smollm3` and `rnope-swa` become SmolLM3 with the same
logits (checked by the export itself); LayerNorm runs and layouts SmolLM3 cannot hold (iRoPE's chunks and temperature,
Gemma 3's two RoPE bases) are refused in one line, exit 2, nothing written. No transformers architecture holds
posenc's LayerNorm block with per-layer spans or NoPE layers (`run.export_smollm3`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

pytest.importorskip("transformers")

from posenc_cli.cli import app
from posenc_cli.run.train import train

PRESETS = ["irope", "rnope-swa", "smollm3", "gemma3"]


def _run(root: Path, preset: str, norm: str = "layernorm") -> Path:
    """A one-step run of `preset`, one period of its pattern deep (Gemma 3: 6 layers, the others 4)."""
    root.mkdir()
    corpus = write_corpus(root)
    model = {"n_layer": 6 if preset == "gemma3" else 4, "norm": norm}
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
    assert "not exportable as SmolLM3ForCausalLM: model.norm=layernorm" in result.output
    assert "Traceback" not in result.output and not out.parent.exists()  # no temporary directory beside --out
    assert sorted(p.name for p in run.rglob("*")) == before


@pytest.mark.parametrize(("preset", "why"), [("irope", "chunked attention"), ("gemma3", "RoPE layers differ")])
def test_a_layout_smollm3_cannot_hold_is_refused(tmp_path: Path, preset: str, why: str) -> None:
    run = _run(tmp_path / "src", preset, norm="rmsnorm")
    out = tmp_path / "out" / "exported"
    result = CliRunner().invoke(app, ["export", str(run), "--out", str(out)], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and why in result.output and not out.parent.exists(), result.output


@pytest.mark.parametrize("preset", ["smollm3", "rnope-swa"])
def test_an_rmsnorm_layout_exports_as_smollm3_with_the_same_logits(tmp_path: Path, preset: str) -> None:
    run = _run(tmp_path / "src", preset, norm="rmsnorm")
    out = tmp_path / "hf"
    result = CliRunner().invoke(app, ["export", str(run), "--out", str(out)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "SmolLM3ForCausalLM" in result.output
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["SmolLM3ForCausalLM"] and config["no_rope_layers"] == [1, 1, 1, 0]
    assert config["layer_types"][0] == ("sliding_attention" if preset == "rnope-swa" else "full_attention")
