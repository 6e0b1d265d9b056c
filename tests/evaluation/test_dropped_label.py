"""A run that dropped its positions (DroPE) is labelled by what it computes: its stored results name the scheme
"rope, dropped at k", never plain "rope", so no table or reference row takes its numbers for RoPE's."""

from __future__ import annotations

import json
from pathlib import Path

from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli.app import app
from posenc_cli.run.train import train


def test_stored_results_name_the_dropped_scheme(tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(tiny_config(write_corpus(tmp_path), pos="rope", steps=4, drope_at=3, save_every=4, eval_every=4), run)
    result = CliRunner().invoke(app, ["eval-extrapolate", str(run), "--lengths", "1,2", "--tokens", "256"])
    assert result.exit_code == 0, result.output
    docs = [json.loads(p.read_text()) for p in (run / "eval").glob("*.json")]
    assert docs and all(doc["scheme"] == "rope, dropped at 3" for doc in docs)
    assert "rope, dropped at 3" in result.output
