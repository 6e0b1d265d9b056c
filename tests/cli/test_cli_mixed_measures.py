"""Tables that never put measures side by side that do not compare (issue #40, item 4), through the CLI: a row's
cells share their token count, perplexities of two tokenizers share no column, every command averages seeds by
compare's rule, a text corpus that is not text is refused, and a task table of a run never trained on the task says
so."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.run.train import train

runner = CliRunner()


# ----------------------------------------------------------------------------------------------------------------
# data=text on a file that is not text


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("command", ["data", "train"])
def test_a_parquet_file_is_refused_as_text(tmp_path: Path, cache: Path, command: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": [f"document {i} " * 40 for i in range(200)]}), corpus)
    args = [command, "data=text", f"data.paths=[{corpus}]", "model.d_model=32", "model.n_layer=1", "model.n_head=2"]
    if command == "train":
        args += ["train.steps=1", "train.device=cpu", "train.threads=1", "--out", str(tmp_path / "run")]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output  # before: exit 0, trained on the file's bytes
    line = one_error_line(result.output)
    assert "corpus.parquet" in line and "NUL byte" in line and "not text" in line
    assert not list(cache.glob("tokens/*/manifest.json"))  # refused before tokenizing
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_invalid_utf8_beyond_a_small_share_is_refused_a_stray_byte_is_not(tmp_path: Path, cache: Path) -> None:
    binary = tmp_path / "latin.txt"
    binary.write_bytes(bytes(range(128, 256)) * 40)  # no NUL, but no UTF-8 either
    result = runner.invoke(app, ["data", "data=text", f"data.paths=[{binary}]"])
    assert result.exit_code == 2, result.output
    assert "is not UTF-8 text" in one_error_line(result.output)

    stray = tmp_path / "stray"
    stray.mkdir()
    for i in range(4):  # one Latin-1 'é' in about 2,000 characters: text with a slip, read with a replacement
        (stray / f"doc{i}.txt").write_bytes(b"plain text line\n" * 120 + b"caf\xe9\n")
    ok = runner.invoke(app, ["data", "data=text", f"data.paths=[{stray}]"])
    assert ok.exit_code == 0, ok.output


# ----------------------------------------------------------------------------------------------------------------
# eval-algorithmic on a run never trained on the tasks

TINY = ["model=tiny", "model.d_model=32", "model.n_layer=1", "model.n_head=2", "train.seq_len=32"]


def test_a_task_table_of_a_run_never_trained_on_the_task_gives_no_training_length(tmp_path: Path) -> None:
    run = tmp_path / "text-run"  # trained on the default corpus (Python sources), never on an algorithmic task
    trained = runner.invoke(app, ["train", *TINY, "train.steps=1", "train.batch_size=2", "--out", str(run)])
    assert trained.exit_code == 0, trained.output
    args = ["eval-algorithmic", str(run), "--tasks", "copy", "--lengths", "1-4", "--examples", "2", "--device", "cpu"]
    shown = runner.invoke(app, args, terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "trained on lengths <= L" not in shown.output  # before: "L = 20 (trained on lengths <= L)"
    assert "not trained on this task" in shown.output


# ----------------------------------------------------------------------------------------------------------------
# eval-extrapolate averages only what compare averages


def test_eval_extrapolate_never_averages_a_run_and_its_export(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="posenc export --to hf needs transformers")
    run = tmp_path / "runs" / "rope"
    train(tiny_config(write_corpus(tmp_path), pos="rope", steps=2), run)
    exported = tmp_path / "exported" / "rope"
    done = runner.invoke(app, ["export", str(run), "--to", "hf", "--out", str(exported)])
    assert done.exit_code == 0, done.output
    args = ["eval-extrapolate", str(exported), str(run), "--lengths", "1", "--tokens", "64", "--device", "cpu"]
    shown = runner.invoke(app, args, terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "n=2" not in shown.output and "±" not in shown.output  # before: 'rope (n=2) 11.94 ± 0.000'
    assert "exported/rope" in shown.output and "runs/rope" in shown.output
