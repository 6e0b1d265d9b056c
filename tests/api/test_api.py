"""`posenc_cli.api` as a notebook uses it: train two tiny runs, evaluate and compare them, no CLI; nothing printed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from train_utils import tiny_overrides, write_corpus

from posenc_cli import api
from posenc_cli.errors import ConfigError, UserError


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """NoPE and ALiBi, 4 steps each on the tiny corpus, through `api.train` alone."""
    root = tmp_path_factory.mktemp("api")
    corpus = write_corpus(root)
    runs = []
    for pos in ("nope", "alibi"):
        result = api.train([*tiny_overrides(corpus, steps=4), f"pos={pos}"], out=root / pos)
        assert result.stopped_reason == "complete" and result.step == 4
        runs.append(result.run_dir)
    return runs


def test_train_evaluate_compare_through_the_api(two_runs: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    evaluation = api.evaluate(two_runs, lengths=[1, 2], tokens=64, device="cpu", threads=1)
    assert [r["label"] for r in evaluation.results] == ["nope", "alibi"]
    assert evaluation.by == "multiple" and evaluation.cells == 4 and evaluation.reused == 0
    assert {e["status"] for r in evaluation.results for e in r["entries"]} == {"ok"}

    frame = api.compare(two_runs)
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.index) == ["nope", "alibi"] and frame.index.name == "run"
    assert list(frame.columns) == ["n", "1×", "2×", "2× / 1×"]
    assert list(frame["n"]) == [1, 1]
    stored = {r["label"]: {e["multiple"]: e["ppl"] for e in r["entries"]} for r in evaluation.results}
    for label in ("nope", "alibi"):  # the frame holds the stored perplexities and their ratio, unrounded
        assert frame.loc[label, "1×"] == stored[label][1.0] and frame.loc[label, "2×"] == stored[label][2.0]
        assert math.isclose(frame.loc[label, "2× / 1×"], stored[label][2.0] / stored[label][1.0])
    assert frame.attrs["metric"] == "ppl" and frame.attrs["title"].startswith("Perplexity by evaluation length")

    again = api.evaluate(two_runs, lengths=[1, 2], tokens=64, device="cpu", threads=1)
    assert again.reused == 4  # stored cells are read back, as the command does
    assert capsys.readouterr() == ("", "")  # the API prints nothing, on stdout or stderr


def test_compare_report_json_csv_and_baseline(two_runs: list[Path], tmp_path: Path) -> None:
    api.evaluate(two_runs, lengths=[1, 2], tokens=64, device="cpu", threads=1)
    report = api.comparison(two_runs, baseline="nope", out=tmp_path / "out")
    assert [p.name for p in report.comparison.written][:2] == ["results.json", "results.csv"]
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == report.comparison.to_json()
    assert (tmp_path / "out" / "results.csv").read_bytes().decode() == report.comparison.to_csv()
    frame = report.comparison.to_frame()
    assert frame.loc["nope", "1×"] == 1.0 and frame.loc["nope", "2×"] == 1.0  # divided by itself


def test_user_errors_are_typed(two_runs: list[Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--lengths .* or --abs-lengths"):
        api.eval_config(lengths=[1], abs_lengths=[16])
    with pytest.raises(ConfigError, match=r"eval.stride \(--stride\) needs eval.protocol \(--protocol\) sliding or"):
        api.eval_config(stride=4)
    with pytest.raises(UserError, match="--metric must be ppl, bpb, nll or longppl"):
        api.compare(two_runs, metric="acc")
    with pytest.raises(ConfigError, match="unknown table .*nope-mrr"):
        api.comparison(two_runs, reference="nope")
    with pytest.raises(ConfigError, match="--out and --resume name different directories"):
        api.train_config(["train.steps=8"], out=tmp_path / "a", resume=two_runs[0])
    with pytest.raises(ConfigError, match="with --resume, overrides must set single keys"):
        api.train_config(["pos=rope"], resume=two_runs[0])
    assert api.train_config(["train.steps=8"], resume=two_runs[0]).train.steps == 8


def test_sweep_dry_plan_through_the_api(capsys: pytest.CaptureFixture[str]) -> None:
    plan = api.plan_sweep("extrapolation", ["train.steps=5", "pos=rope,alibi"], check=True)
    assert plan.jobs == 4 and plan.launcher_name == "basic"  # two schemes, then the rope run's two YaRN children
    assert [job.label for job in plan.plans[0].jobs] == ["rope", "alibi"]
    assert capsys.readouterr() == ("", "")


def test_extend_through_the_api(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = write_corpus(tmp_path)
    parent = api.train([*tiny_overrides(corpus, steps=4), "pos=rope"], out=tmp_path / "rope").run_dir
    outcome = api.extend(parent, tmp_path / "yarn", method="yarn", factor=2.0)
    assert outcome.result.status == "created" and outcome.result.method == "yarn"
    assert outcome.result.factor == 2.0 and outcome.result.original_length == 16 and (tmp_path / "yarn").is_dir()
    assert api.extend(parent, tmp_path / "yarn", method="yarn", factor=2.0).result.status == "already_complete"
    with pytest.raises(ConfigError, match="--window"):
        api.extend(parent, tmp_path / "se", method="self-extend", group=2)
    assert capsys.readouterr() == ("", "")
