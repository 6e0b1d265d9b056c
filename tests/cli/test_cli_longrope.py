"""`posenc extend --longrope` through Typer's CliRunner: --factors FILE, --search (factors in the child's config and
its factors file), and refusals (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.extension.longrope_search import FACTORS_FILE
from posenc_cli.run.load import load_run
from posenc_cli.run.train import train

runner = CliRunner()
PAIRS = 8  # tiny runs: head dim 16


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli-longrope")
    corpus = write_corpus(root)
    out = {}
    for pos, steps in (("rope", 6), ("alibi", 1), ("learned", 1)):
        out[pos] = root / pos
        train(tiny_config(corpus, pos=pos, steps=steps), out[pos])
    return out


def invoke(*args: str):
    return runner.invoke(app, ["extend", *args], env={"COLUMNS": "200"})


def factors_file(tmp_path: Path, short: list[float], long: list[float]) -> Path:
    path = tmp_path / "factors.json"
    path.write_text(json.dumps({"short_factor": short, "long_factor": long}))
    return path


def test_factors_file_goes_into_the_child_config(runs: dict[str, Path], tmp_path: Path) -> None:
    short, long = [1.0] * PAIRS, [1.0, 1.0, 1.5, 2.0, 3.0, 4.0, 4.5, 5.0]
    out = tmp_path / "child"
    result = invoke(str(runs["rope"]), "--longrope", "--factor", "4", "--factors",
                    str(factors_file(tmp_path, short, long)), "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "1.2247" in result.output  # √(1 + ln 4 / ln 16) = √1.5
    assert "2 keep · 3 blended · 3 interpolated" in result.output
    scaling = load_run(out).config.pos.scaling  # type: ignore[attr-defined]
    assert (scaling.method, scaling.params.short_factor, scaling.params.long_factor) == ("longrope", short, long)


def test_search_writes_the_found_factors(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "child"
    args = ["--search", "--factor", "4", "--search-budget", "3", "--search-tokens", "128", "--out", str(out)]
    result = invoke(str(runs["rope"]), *args)  # --search implies --longrope
    assert result.exit_code == 0, result.output
    assert "LongRoPE search: 3 candidates" in result.output
    doc = json.loads((out / FACTORS_FILE).read_text())
    scaling = load_run(out).config.pos.scaling  # type: ignore[attr-defined]
    assert scaling.method == "longrope" and scaling.params.long_factor == doc["long_factor"]
    assert len(doc["long_factor"]) == PAIRS and doc["search"]["budget"] == 3
    assert "train split tokens [0, 129)" in " ".join(result.output.split())  # 2 windows of 64 + 1
    assert doc["search"]["data"]["split"] == "train"

    again = invoke(str(runs["rope"]), *args)  # decided done before the search: no candidate scored
    assert again.exit_code == 0, again.output
    flat = " ".join(again.output.split())
    assert "already extended (nothing to do)" in flat and "not re-run" in flat and "candidates" not in flat


@pytest.mark.parametrize(
    ("run", "args", "message"),
    [
        ("alibi", ["--search"], "uses pos=alibi; frequency scaling (extend) applies only to RoPE"),
        ("learned", ["--search"], "uses pos=learned; frequency scaling (extend) applies only to RoPE"),
        ("alibi", ["--longrope", "--long-factor", "2"] * 1, "uses pos=alibi"),
        ("rope", ["--longrope"], "LongRoPE needs its factors"),
        ("rope", ["--yarn", "--search"], "--search belongs to LongRoPE (--longrope), not --method yarn"),
        ("rope", ["--search", "--factors", "f.json"], "give --factors FILE or --search, not both"),
        ("rope", ["--search", "--long-factor", "2"], "give the factors once"),
        ("rope", ["--search", "--search-budget", "0"], "--search-budget must be >= 1"),
        ("rope", ["--factors", "missing.json"], "missing.json: the --factors file not found"),
        (
            "rope",
            ["--longrope", "--long-factor", "2", "--long-factor", "3"],
            "long_factor has 2 values; this RoPE has 8",
        ),
        ("rope", ["--longrope", "--long-factor", "2"] + ["--long-factor", "0"] * 7, "long_factor must be > 0"),
    ],
)
def test_refusals_exit_2_and_write_nothing(
    runs: dict[str, Path], tmp_path: Path, run: str, args: list[str], message: str
) -> None:
    out = tmp_path / "child"
    args = [str(tmp_path / a) if a.endswith(".json") else a for a in args]
    result = invoke(str(runs[run]), *args, "--out", str(out))
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_bad_factors_file_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "child"
    path = factors_file(tmp_path, [1.0] * 4, [2.0] * 4)  # 4 values for 8 pairs
    result = invoke(str(runs["rope"]), "--factors", str(path), "--out", str(out))
    assert result.exit_code == 2 and "short_factor has 4 values; this RoPE has 8" in result.output
    assert not out.exists()
