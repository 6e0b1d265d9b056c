"""`posenc extend` through Typer's CliRunner: summary, default output directory, refusals with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.run.load import load_run
from posenc_cli.run.train import train

runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli-extend")
    corpus = write_corpus(root)
    out = {}
    for pos, steps in (("rope", 6), ("alibi", 2)):
        out[pos] = root / pos
        train(tiny_config(corpus, pos=pos, steps=steps), out[pos])
    return out


def invoke(*args: str):
    return runner.invoke(app, ["extend", *args], env={"COLUMNS": "200"})


def test_yarn_extension_prints_the_before_after_summary(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "child"
    result = invoke(str(runs["rope"]), "--yarn", "--factor", "4", "--out", str(out))
    assert result.exit_code == 0, result.output
    text = result.output
    assert "1 keep · 0 blended · 7 interpolated" in text  # d = 16, L = 16: only pair 0 keeps its frequency
    assert "1.1386" in text  # 0.1·ln 4 + 1
    assert "copied unchanged" in text
    child = load_run(out)
    assert child.config.pos.scaling.method == "yarn"  # type: ignore[attr-defined]
    again = invoke(str(runs["rope"]), "--yarn", "--factor", "4", "--out", str(out))
    assert again.exit_code == 0 and "nothing to do" in again.output


def test_summary_keeps_whole_paths_in_a_narrow_terminal(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from posenc_cli.cli.app import console

    monkeypatch.setattr(console, "width", 80)  # the console took its width from COLUMNS at import
    out = tmp_path / "outputs" / "sweeps" / "2026-11-29_extrapolation" / "train" / "pos=rope-yarnx4"
    result = runner.invoke(app, ["extend", str(runs["rope"]), "--yarn", "--factor", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("│ run"))
    end = next(i for i, line in enumerate(lines) if line.startswith("│ scaling"))
    assert max(len(line) for line in lines) <= 80
    cells = [line.split("│")[1:4] for line in lines[start:end]]  # label, before, after
    assert "".join(c[2].strip() for c in cells) == str(out)  # folded over lines, not cut with "…"
    assert "".join(c[1].strip() for c in cells) == str(runs["rope"])
    assert len(cells[0][2]) > 20  # the long labels wrap too, so the values keep a fair share of the width


def test_default_out_and_method_flag(runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(runs["rope"].parent)
    result = invoke("rope", "--method", "linear", "--factor", "2")
    assert result.exit_code == 0, result.output
    assert "│ rope-linearx2 " in result.output  # shown relative to the working directory, like the parent
    child = runs["rope"].with_name("rope-linearx2")
    meta = json.loads((child / "meta.json").read_text())
    assert meta["parent"] == str(runs["rope"].resolve())
    assert load_run(child).config.pos.scaling.factor == 2.0  # type: ignore[attr-defined]


def test_eval_prints_parent_and_child_side_by_side(runs: dict[str, Path], tmp_path: Path) -> None:
    result = invoke(str(runs["rope"]), "--ntk", "--factor", "2", "--out", str(tmp_path / "ntk"), "--eval")
    assert result.exit_code == 0, result.output
    assert "Perplexity by evaluation length" in result.output
    rows = [line.split("│")[1].split()[0] for line in result.output.splitlines() if line.startswith("│ ")]
    assert {"rope", "ntk"} <= set(rows)  # one row per run: the parent and the child
    assert (tmp_path / "ntk" / "eval" / "extrapolate.json").is_file()  # results go into the new run ...
    assert not (runs["rope"] / "eval").exists()  # ... never into the source run


def test_finetune_from_the_cli(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "ft"
    args = ["--dynamic", "--factor", "2", "--finetune-steps", "2", "--finetune-warmup", "1", "--threads", "1"]
    result = invoke(str(runs["rope"]), *args, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "step 2/2 at 32 tokens" in result.output
    assert json.loads((out / "meta.json").read_text())["train_length"] == 32


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--yarn"], "pos=alibi; frequency scaling"),
        (["--factor", "1"], "factor must be > 1"),
        (["--method", "nosuch"], "unknown scaling method 'nosuch'"),
        (["--yarn", "--linear"], "give one scaling method"),
        (["--factor", "nan"], "--factor must be a finite number"),
        (["--yarn", "--attention-factor", "nan"], "--attention-factor must be a finite number"),
        (["--yarn", "--beta-fast", "inf"], "--beta-fast must be a finite number"),
        (["--yarn", "--beta-slow", "-inf"], "--beta-slow must be a finite number"),
    ],
)
def test_refusals_exit_2_and_write_nothing(
    runs: dict[str, Path], tmp_path: Path, args: list[str], message: str
) -> None:
    run = runs["alibi"] if "alibi" in message else runs["rope"]
    out = tmp_path / "child"
    result = invoke(str(run), *args, "--out", str(out))
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not out.exists()


def test_non_empty_out_dir_exits_2(runs: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("x")
    result = invoke(str(runs["rope"]), "--yarn", "--out", str(tmp_path))
    assert result.exit_code == 2
    assert "not empty" in result.output
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


_MISSING = "run directory {missing} does not exist"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--yarn"], _MISSING),
        (["--method", "linear", "--factor", "2"], _MISSING),
        (["--longrope", "--search"], _MISSING),
        (["--method", "rerope", "--window", "8"], _MISSING),
        (["--method", "self-extend", "--window", "8", "--group", "2"], _MISSING),
        (["--method", "rerope"], "--method rerope needs --window W"),
        (["--method", "foo"], "unknown scaling method 'foo' (available: linear, ntk, dynamic, yarn, longrope, llama3)"),
        (["--yarn", "--method", "rerope"], "give one method, got yarn, rerope"),
    ],
)
def test_a_refusal_that_needs_no_checkpoint_is_one_line_before_torch(
    tmp_path: Path, args: list[str], message: str
) -> None:
    """`posenc extend MISSING` (a scaling, a search or a remapping), a remapping without its settings and an
    unknown method exit 2 with one line, and import no torch (seconds) to say so: `-X importtime` lists every
    module imported on stderr, before the error line."""
    missing = tmp_path / "missing"
    cmd = [sys.executable, "-X", "importtime", "-m", "posenc_cli", "extend", str(missing), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    lines = done.stderr.splitlines()
    imported = [line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")]
    assert done.returncode == 2 and done.stdout == ""
    assert [line for line in lines if not line.startswith("import time:")] == [
        "error: " + message.format(missing=missing)
    ]
    assert "posenc_cli.extension.plan" in imported
    assert not [name for name in imported if name == "torch" or name.startswith("torch.")]


def test_help_shows_an_example() -> None:
    result = runner.invoke(app, ["extend", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "posenc extend outputs/runs/rope --yarn --factor 4" in result.output


def test_help_is_readable_at_80_columns() -> None:
    """Piped or in an 80-column terminal nothing is cut ("…|self-extend|re…"): every method is named in full."""
    from posenc_cli.rope_scaling import registry

    result = runner.invoke(app, ["extend", "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert "…" not in result.output and max(len(line) for line in result.output.splitlines()) <= 80
    flat = " ".join(result.output.replace("│", " ").split())
    assert f"One of {', '.join(registry())}, self-extend, rerope (default yarn)" in flat
    assert "posenc extend RUN --method rerope --window 96" in result.output


def test_eval_labels_a_sweep_job_as_compare_does(runs: dict[str, Path], tmp_path: Path) -> None:
    """The parent, a sweep's job, keeps its plan label in extend --eval's table (one label per run everywhere)."""
    import shutil

    sweep = tmp_path / "sweep"
    job = sweep / "train" / "pos=rope"
    shutil.copytree(runs["rope"], job, ignore=shutil.ignore_patterns("eval"))
    plan = {"stage": "train", "name": "pos=rope", "dir": "train/pos=rope", "label": "my-rope", "parent": None}
    (sweep / "sweep.json").write_text(json.dumps({"schema_version": 1, "sweep": "t", "jobs": [{**plan, "swept": {}}]}))
    result = invoke(str(job), "--ntk", "--factor", "2", "--out", str(tmp_path / "ntk"), "--eval")
    assert result.exit_code == 0, result.output
    cells = [line.split("│")[1].split() for line in result.output.splitlines() if line.startswith("│ ")]
    rows = [c[0] for c in cells if c]  # a wrapped cell continues on a line whose first column is empty
    assert "my-rope" in rows and "pos=rope" not in rows
