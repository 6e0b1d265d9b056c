"""`posenc data` through Typer's test runner: summary, cache reuse, one-line errors with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import posenc_cli.data.cache as data_mod
from posenc_cli import api
from posenc_cli.cli import app

runner = CliRunner()


@pytest.fixture
def corpus_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(12):
        (root / f"doc{i}.txt").write_text(f"document {i} with ünïcode\n" * (i + 1))
    return root


def test_data_command_prepares_then_reuses(corpus_dir: Path, tmp_path: Path) -> None:
    args = ["data", "data=text", f"data.paths=[{corpus_dir}]", "data.val_fraction=0.25"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    for word in ("documents", "tokens", "fingerprint", "byte (vocab 257", "cache", "no: tokenized"):
        assert word in first.output
    assert "12 train" not in first.output  # some documents went to validation
    assert len(list((tmp_path / "cache" / "tokens").glob("*/manifest.json"))) == 1  # POSENC_CACHE_DIR honoured
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "yes: reused" in second.output


def test_data_command_reuse_skips_tokenization(corpus_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["data", "data=text", f"data.paths=[{corpus_dir}]"]
    assert runner.invoke(app, args).exit_code == 0

    def fail(*a: object) -> None:
        raise AssertionError("tokenized again")

    monkeypatch.setattr(data_mod, "tokenize", fail)
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "reused" in result.output


def test_data_command_bpe(corpus_dir: Path) -> None:
    result = runner.invoke(
        app, ["data", "data=text", f"data.paths=[{corpus_dir}]", "tokenizer=bpe", "tokenizer.vocab_size=300"]
    )
    assert result.exit_code == 0, result.output
    assert "bpe (vocab" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["data.bogus=1"], "unknown config key 'data.bogus'"),
        (["data.val_fraction=2"], "data.val_fraction must be in [0, 1]"),
        (["some/path"], "takes only KEY=VALUE overrides"),
        (["data=text"], "data=text needs data.paths"),
    ],
)
def test_data_command_user_errors(args: list[str], message: str, corpus_dir: Path) -> None:
    result = runner.invoke(app, ["data", *args])
    assert result.exit_code == 2
    assert message in result.output.replace("\n", " ")
    assert "Traceback" not in result.output


def test_data_command_missing_path(tmp_path: Path, corpus_dir: Path) -> None:
    missing = tmp_path / "nope.txt"
    result = runner.invoke(app, ["data", "data=text", f"data.paths=[{missing}]"])
    assert result.exit_code == 2
    assert "not found" in result.output and "nope.txt" in result.output


def test_files_note_explains_files_vs_documents() -> None:
    from posenc_cli.cli.data import files_note

    # `posenc data` printed 1,790 files and 1,727 + 35 documents with no word why
    assert files_note(1790, {"train": 1727, "val": 35}) == "1,790 (28 empty files skipped: no document)"
    assert files_note(3, {"train": 2, "val": 1}) == "3"
    assert files_note(1, {"train": 1, "val": 1}) == "1"  # one file cut into train and val


@pytest.mark.parametrize("failure", ["enospc", "short-write"])
@pytest.mark.parametrize("command", ["data", "train"])
def test_a_full_disk_under_the_token_cache_is_one_line_naming_the_file(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str, command: str
) -> None:
    import errno

    def full(f, data) -> None:
        if failure == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device")  # as os.write raises it: no file name
        raise OSError("4096 requested and 1024 written")  # numpy's tofile: a short write, no errno

    monkeypatch.setattr(data_mod, "write_all", full)
    args = ["data=text", f"data.paths=[{corpus_dir}]", "model.d_model=32", "model.n_layer=1", "model.n_head=2"]
    if command == "train":
        args += ["train.steps=1", "train.device=cpu", "train.threads=1", "--out", str(tmp_path / "run")]
    result = runner.invoke(app, [command, *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "train.bin: No space left on device" in lines[0] and str(tmp_path / "cache") in lines[0]
    entries = list((tmp_path / "cache" / "tokens").glob("*"))
    assert all(sorted(p.name for p in e.iterdir()) == [] for e in entries)  # no half-written split or manifest
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_data_command_shows_the_longest_example_and_prompt_of_task_data(corpus_dir: Path) -> None:
    """What a task's 1× prompt must not exceed to be in distribution (issue #38): shown for prompt/answer data,
    not for plain text, where every token is scored."""
    args = ["data", "data=tasks", "data.tasks=[niah-single]", "data.episodes=200", "data.max_len=96"]
    shown = runner.invoke(app, args, terminal_width=200)
    assert shown.exit_code == 0, shown.output
    info = api.prepare_data(args[1:])
    assert 0 < info["longest_prompt"] < info["longest_example"]
    text = " ".join(shown.output.split())
    assert "longest example" in text
    assert f"{info['longest_example']} tokens, its prompt up to {info['longest_prompt']} (train;" in text
    plain = runner.invoke(app, ["data", "data=text", f"data.paths=[{corpus_dir}]"], terminal_width=200)
    assert plain.exit_code == 0 and "longest example" not in plain.output
    assert api.prepare_data(["data=text", f"data.paths=[{corpus_dir}]"])["longest_prompt"] is None


def test_data_command_shows_each_task_s_longest_prompt_of_a_mixture() -> None:
    """A mixture's tasks reach different prompt lengths at one data.max_len: `posenc data` and `api.prepare_data`
    give each its own, the bound the competence gate holds that task's cells to."""
    args = ["data", "data=tasks", "data.tasks=[niah-single,variable-tracking]", "data.episodes=200"]
    shown = runner.invoke(app, [*args, "data.max_len=160"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    info = api.prepare_data([*args[1:], "data.max_len=160"])
    by_task = info["longest_prompt_by_task"]
    assert set(by_task) == {"niah-single", "variable-tracking"} and max(by_task.values()) == info["longest_prompt"]
    text = " ".join(shown.output.split())
    assert f"niah-single {by_task['niah-single']}, variable-tracking {by_task['variable-tracking']} tokens" in text
    own = api.prepare_data([*args[1:], "data.max_len=160", "data.max_len_per_task=[320,160]"])
    assert own["longest_prompt_by_task"]["niah-single"] > by_task["niah-single"]  # its episodes drawn to 320 chars
    single = api.prepare_data(["data=tasks", "data.tasks=[niah-single]", "data.episodes=200", "data.max_len=96"])
    assert single["longest_prompt_by_task"] == {"niah-single": single["longest_prompt"]}
