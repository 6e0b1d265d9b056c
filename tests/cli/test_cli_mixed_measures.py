"""Tables that never put measures side by side that do not compare (issue #40, item 4), through the CLI: a row's
cells share their token count, perplexities of two tokenizers share no column, every command averages seeds by
compare's rule, a text corpus that is not text is refused, and a task table of a run never trained on the task says
so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_compare import entry
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli import api
from posenc_cli.cli import app
from posenc_cli.config import Config, EvalConfig, ModelConfig, config_to_yaml
from posenc_cli.evaluation.results import new_results_doc, results_path
from posenc_cli.fsutil import atomic_write_json
from posenc_cli.positional import config_class
from posenc_cli.run.journal import commit_checkpoint
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
    assert "Perplexity by evaluation length" in shown.output  # an export tokenizes as its run: one tokenizer
    compared = runner.invoke(app, ["compare", str(exported), str(run)], terminal_width=200)
    assert compared.exit_code == 0 and "Perplexity by evaluation length" in compared.output, compared.output


# ----------------------------------------------------------------------------------------------------------------
# compare: one token count per row, one tokenizer per perplexity column

BYTE = {"kind": "byte", "vocab_size": 257, "fingerprint": "byte0000"}
BPE = {"kind": "bpe", "vocab_size": 300, "fingerprint": "bpe00000"}


def stored_run(run_dir: Path, scheme: str, entries: list[dict[str, Any]], tokenizer: dict[str, Any] = BYTE) -> None:
    """A run directory (config, meta.json with its tokenizer, no weights) with stored eval-extrapolate cells."""
    cfg = Config(model=ModelConfig(), pos=config_class(scheme)(name=scheme), eval=EvalConfig(lengths=[1.0, 2.0, 4.0]))
    meta = {"kind": "posenc-run", "schema_version": 1, "step": 1, "train_length": 16, "base_length": 16}
    meta |= {"status": "complete", "data": {"fingerprint": "x"}, "tokenizer": tokenizer}
    commit_checkpoint(run_dir, {"config.yaml": config_to_yaml(cfg).encode()}, meta)
    doc = new_results_doc(run_dir.name, scheme, 16, 16)
    doc["entries"] = entries
    atomic_write_json(results_path(run_dir), doc)


def cell(length: int, ppl: float, tokens: int, created: str = "2025-01-01T00:00:00+00:00", **kw: Any) -> dict:
    return {**entry(length, ppl), "tokens": tokens, "created": created, **kw}


def row_cells(output: str, label: str) -> list[str]:
    line = next(line for line in output.splitlines() if line.startswith(f"│ {label} "))
    return [c.strip() for c in line.split("│")[2:-1]]


def test_a_row_keeps_one_token_count_after_a_later_evaluation_with_another(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "rope"
    full = [cell(16, 20.0, 16384), cell(32, 12.55, 16384), cell(64, 12.75, 16384)]
    stored_run(run, "rope", full)
    before = api.compare([run])
    later = cell(16, 20.79, 1024, created="2025-02-01T00:00:00+00:00")  # eval-extrapolate --lengths 1 --tokens 1024
    stored_run(run, "rope", [*full, later])
    shown = runner.invoke(app, ["compare", str(run)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert row_cells(shown.output, "rope")[:4] == ["20.00", "12.55", "12.75", "0.637"]  # before: 20.79 ... 0.613
    assert "16,384 scored tokens per cell" in " ".join(shown.output.split())
    after = api.compare([run])
    assert after.equals(before)  # api.compare's answer no longer moves with a later evaluation


def test_a_row_that_mixes_token_counts_says_so_and_has_no_ratio(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "rope"
    stored_run(run, "rope", [cell(16, 20.79, 1024), cell(32, 12.55, 16384), cell(64, 12.75, 16384)])
    shown = runner.invoke(app, ["compare", str(run)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    cells = row_cells(shown.output, "rope")
    assert cells[:3] == ["20.79", "12.55", "12.75"] and cells[3] == "n/m"  # before: 0.613, 12.75 / 20.79
    flat = " ".join(shown.output.split())
    assert "scored tokens per cell vary" in flat
    assert "scored tokens for rope (mixed row, no ratio across counts): 1×: 1,024; 2×, 4×: 16,384" in flat
    frame = api.compare([run])
    assert frame.isna().loc["rope", "4× / 1×"]
    mark, why = frame.attrs["marks"][("rope", "4× / 1×")]
    assert mark == "n/m" and why == "no ratio across different scored-token counts (16,384 vs 1,024 tokens)"


def test_runs_with_different_tokenizers_are_compared_per_byte(tmp_path: Path) -> None:
    stored_run(tmp_path / "runs" / "bpe", "rope", [cell(16, 97.68, 4096, bpb=0.9)], tokenizer=BPE)
    stored_run(tmp_path / "runs" / "text", "rope", [cell(16, 16.82, 4096, bpb=4.07)], tokenizer=BYTE)
    shown = runner.invoke(app, ["compare", str(tmp_path / "runs")], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "97.68" not in shown.output and "16.82" not in shown.output  # before: both in one "Perplexity" column
    assert row_cells(shown.output, "bpe (rope)")[0] == "0.900" and row_cells(shown.output, "text (rope)")[0] == "4.070"
    flat = " ".join(shown.output.split())
    assert "Bits per byte by evaluation length" in flat
    assert "Bits per byte, not perplexity: the runs' tokenizers differ (bpe, vocab 300: bpe (rope); byte: text" in flat
    assert api.compare([tmp_path / "runs"]).attrs["metric"] == "bpb"
    one = runner.invoke(app, ["compare", str(tmp_path / "runs" / "bpe")], terminal_width=200)
    assert "97.68" in one.output and "Perplexity by evaluation length" in one.output  # one tokenizer: as asked


def test_whole_window_rounding_of_one_budget_is_not_a_mixed_row(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "rope"  # --tokens 1000: 63 windows of 16, 32 of 32, 16 of 64
    stored_run(run, "rope", [cell(16, 20.0, 1008), cell(32, 12.55, 1024), cell(64, 12.75, 1024)])
    shown = runner.invoke(app, ["compare", str(run)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert row_cells(shown.output, "rope")[3] == "0.637"
    assert "1,008–1,024 scored tokens per cell (one budget in whole windows)" in " ".join(shown.output.split())


def test_eval_extrapolate_shows_bits_per_byte_for_runs_of_two_tokenizers(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path)
    data = ["data=text", f"data.paths=[{corpus}]", "train.steps=1", "train.batch_size=2"]
    for name, tokenizer in (("bpe", ["tokenizer=bpe", "tokenizer.vocab_size=300"]), ("byte", [])):
        done = runner.invoke(app, ["train", *TINY, *data, *tokenizer, "--out", str(tmp_path / "runs" / name)])
        assert done.exit_code == 0, done.output
    args = ["eval-extrapolate", str(tmp_path / "runs"), "--lengths", "1", "--tokens", "64", "--device", "cpu"]
    shown = runner.invoke(app, args, terminal_width=200)
    assert shown.exit_code == 0, shown.output
    flat = " ".join(shown.output.split())
    assert "Bits per byte by evaluation length" in flat  # before: both runs' per-token perplexities in one column
    assert "the runs' tokenizers differ (bpe, vocab 300: bpe (rope); byte: byte (rope))" in flat
