"""`compare --format markdown` of runs trained on answer tokens only: they have no perplexity table (their caption
says why), so the markdown draws none rather than an empty, malformed one, and the task rows follow."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc_cli.cli import app

runner = CliRunner()
TINY = ["model=tiny", "model.d_model=16", "model.n_layer=1", "model.n_head=2", "train.seq_len=256"]
ANSWER_ONLY = ["data=tasks", "data.tasks=[niah-single]", "data.episodes=400", "train.steps=1", "train.batch_size=2",
               "train.loss_on=answer", "train.packing=none", "train.threads=1"]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("answer-only") / "answer-run"
    trained = runner.invoke(app, ["train", *TINY, *ANSWER_ONLY, "--out", str(path)])
    assert trained.exit_code == 0, trained.output
    return path


def test_markdown_draws_no_empty_perplexity_table(run: Path) -> None:
    shown = runner.invoke(app, ["compare", str(run), "--format", "markdown"], terminal_width=250)
    assert shown.exit_code == 0, shown.output
    assert "No perplexity for answer-run" in shown.output
    assert "Perplexity by evaluation length" not in shown.output
    assert not any(line.strip() in ("| run |  |", "|---|") for line in shown.output.splitlines()), shown.output
