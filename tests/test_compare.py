"""compare: labels and order wherever a sweep's runs are reached, the sweep's own lengths, n/a vs –, --baseline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from posenc_cli.analysis import compare
from posenc_cli.cli import app
from posenc_cli.config import Config, EvalConfig, ModelConfig, config_to_yaml
from posenc_cli.evaluation.results import checkpoint_identity, new_results_doc, save_results
from posenc_cli.positional import config_class
from posenc_cli.run.checkpoint import RunMeta, commit_checkpoint
from posenc_cli.sweep.runner import _mark_done

runner = CliRunner()


def entry(length: int, ppl: float | None, base: int = 16) -> dict[str, Any]:
    return {
        "protocol": "nonoverlap",
        "stride": None,
        "length": length,
        "multiple": length / base,
        "tokens": 256,
        "dtype": "fp32",
        "device": "cpu (Test CPU)",
        "data": {"name": "text", "fingerprint": "x"},
        "status": "ok" if ppl is not None else "n/a",
        "reason": None if ppl is not None else "scheme 'learned' supports at most 16 positions",
        "ppl": ppl,
        "nll": None,
        "bpb": None,
        "per_position": [],
        "created": "2025-01-01T00:00:00+00:00",
        "checkpoint": {"step": 1, "model_sha256": None},  # what `fake_run`'s meta.json names
    }


def fake_run(run_dir: Path, scheme: str, ppls: dict[int, float | None], lengths: list[float]) -> None:
    """A run directory with a config (eval.lengths = `lengths`) and stored results, without any weights."""
    cfg = Config(model=ModelConfig(), pos=config_class(scheme)(name=scheme), eval=EvalConfig(lengths=lengths))
    commit_checkpoint(
        run_dir,
        {"config.yaml": config_to_yaml(cfg).encode()},
        {
            "kind": "posenc-run",
            "schema_version": 1,
            "step": 1,
            "train_length": 16,
            "base_length": 16,
            "status": "complete",
        },
    )
    doc = new_results_doc(run_dir.name, scheme, 16, 16)
    doc["entries"] = [entry(n, p) for n, p in ppls.items()]
    save_results(run_dir, doc)
    _mark_done(run_dir, run_dir.name)  # a sweep job counts only with its done marker


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    """A sweep planned as [rope, alibi, learned] (not alphabetical), each evaluated at 1×, 2×, 4×; the alibi run
    was later also evaluated ad hoc at 3× (48 tokens); an extend output below it was evaluated at 0.5×..4×."""
    out = tmp_path / "sweep"
    lengths = [1.0, 2.0, 4.0]
    fake_run(out / "train/pos=rope", "rope", {16: 10.0, 32: 12.0, 64: 20.0}, lengths)
    fake_run(out / "train/pos=alibi", "alibi", {16: 9.0, 32: 9.0, 48: 9.1, 64: 12.0}, lengths)
    fake_run(out / "train/pos=learned", "learned", {16: 11.0, 32: None, 64: None}, lengths)
    fake_run(out / "train/pos=rope-yarnx2", "rope", {8: 12.0, 16: 11.0, 32: 11.0, 64: 12.0}, [0.5, 1, 2, 4])
    jobs = [
        {"stage": "train", "name": f"pos={s}", "dir": f"train/pos={s}", "label": s, "parent": None, "swept": {}}
        for s in ("rope", "alibi", "learned")
    ]
    (out / "sweep.json").write_text(json.dumps({"schema_version": 1, "sweep": "t", "jobs": jobs}))
    return out


def labels(records: list[compare.RunRecord]) -> list[str]:
    return [r.label for r in records]


def test_one_label_and_order_however_the_runs_are_reached(sweep_dir: Path) -> None:
    expected = ["rope", "alibi", "learned", "train/pos=rope-yarnx2"]
    assert labels(compare.gather([sweep_dir])) == expected
    assert labels(compare.gather([sweep_dir / "train"])) == expected  # was pos=alibi, pos=learned, ... sorted
    assert labels(compare.gather([sweep_dir / "train/pos=alibi"])) == ["alibi"]
    results = [{"path": str(sweep_dir / "train" / d), "scheme": s} for d, s in (("pos=alibi", "alibi"),
               ("pos=learned", "learned"), ("pos=rope", "rope"), ("pos=rope-yarnx2", "rope"))]  # fmt: skip
    assert [r["label"] for r in compare.labelled_in_order(results)] == expected


def test_outside_a_sweep_runs_keep_their_names(tmp_path: Path) -> None:
    fake_run(tmp_path / "runs" / "b", "rope", {16: 10.0}, [1.0])
    fake_run(tmp_path / "runs" / "a-alibi", "alibi", {16: 9.0}, [1.0])
    assert labels(compare.gather([tmp_path / "runs"])) == ["a-alibi", "b (rope)"]


def test_a_sweep_shows_its_own_lengths_unless_asked(sweep_dir: Path) -> None:
    columns, _, _ = compare.comparison(compare.gather([sweep_dir]))
    assert [c.key for c in columns] == [1.0, 2.0, 4.0, "ratio"]  # no 3× of alibi, no 0.5× of the extend output
    assert {e["multiple"] for e in compare.records_to_json(compare.gather([sweep_dir]))} == {1.0, 2.0, 4.0}
    columns, _, _ = compare.comparison(compare.gather([sweep_dir / "train"]))
    assert [c.key for c in columns] == [1.0, 2.0, 4.0, "ratio"]
    columns, _, _ = compare.comparison(compare.gather([sweep_dir], all_lengths=True))
    assert [c.key for c in columns] == [0.5, 1.0, 2.0, 3.0, 4.0, "ratio"]


def test_write_outputs_never_adds_columns_the_sweep_did_not_measure(sweep_dir: Path, tmp_path: Path) -> None:
    compare.write_outputs(compare.gather([sweep_dir]), sweep_dir)
    rows = json.loads((sweep_dir / "results.json").read_text())
    assert sorted({r["multiple"] for r in rows}) == [1.0, 2.0, 4.0]
    header = (sweep_dir / "results.csv").read_text().splitlines()[0]
    assert "dtype" in header and "device" in header
    assert {r["device"] for r in rows} == {"cpu (Test CPU)"}


def render(records: list[compare.RunRecord], **kw: Any) -> str:
    console = Console(width=200, record=True)
    compare.render(records, console=console, **kw)
    return console.export_text()


def test_cannot_and_not_measured_look_different(sweep_dir: Path) -> None:
    text = render(compare.gather([sweep_dir], all_lengths=True))
    learned = next(line for line in text.splitlines() if line.startswith("│ learned"))
    cells = [c.strip() for c in learned.split("│")[2:-1]]
    assert cells == ["–", "11.00", "n/a", "–", "n/a", "n/a"]  # 0.5× and 3× never measured; 2×, 4× cannot
    flat = " ".join(text.split())  # the caption wraps at the table's width
    assert "n/a = the scheme cannot read that many tokens (reasons below); – = not measured" in flat
    assert "n/a for learned at 32, 64: scheme 'learned' supports at most 16 positions" in flat
    assert "Measured in fp32 on cpu (Test CPU)." in flat
    markdown = " ".join(render(compare.gather([sweep_dir], all_lengths=True), fmt="markdown").split())
    assert "| learned | – | 11.00 | n/a | – | n/a | n/a |" in markdown and "– = not measured" in markdown


def test_baseline_divides_the_ratio_column_too(sweep_dir: Path) -> None:
    records = compare.gather([sweep_dir])
    columns, rows, title = compare.comparison(records, baseline="alibi")
    assert columns[-1].header == "4× / 1×\n÷ alibi" and "relative to alibi" in title
    rope = next(r for r in rows if r.label == "rope")
    assert rope.cells["ratio"].mean == pytest.approx((20.0 / 10.0) / (12.0 / 9.0))  # was rope's own 2.0
    assert rope.cells[4.0].mean == pytest.approx(20.0 / 12.0)
    alibi = next(r for r in rows if r.label == "alibi")
    assert alibi.cells["ratio"].mean == pytest.approx(1.0)


def test_compare_cli_all_lengths(sweep_dir: Path) -> None:
    result = runner.invoke(app, ["compare", str(sweep_dir), "--format", "markdown"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "3×" not in result.output and "0.5×" not in result.output
    result = runner.invoke(app, ["compare", str(sweep_dir), "--all-lengths", "--format", "markdown"])
    assert result.exit_code == 0 and "3× 48" in result.output


def _checkpoint(run_dir: Path, step: int, weights: bytes) -> dict[str, Any]:
    """Commit fake weights as the run's checkpoint at `step`; its identity, as evaluation records it."""
    meta = {"kind": "posenc-run", "schema_version": 1, "step": step, "train_length": 16, "status": "complete"}
    return checkpoint_identity(RunMeta.from_json(commit_checkpoint(run_dir, {"model.safetensors": weights}, meta)))


def test_cells_of_an_earlier_checkpoint_are_not_measured(tmp_path: Path) -> None:
    fake_run(tmp_path / "runs" / "alibi", "alibi", {16: 9.0, 32: 9.0, 64: 12.0}, [1.0, 2.0, 4.0])
    run = tmp_path / "runs" / "rope"
    old = _checkpoint(run, 1, b"weights at step 1")
    doc = new_results_doc("rope", "rope", 16, 16)
    doc["entries"] = [{**entry(n, p), "checkpoint": old} for n, p in {16: 10.0, 32: 12.0, 64: 20.0}.items()]
    save_results(run, doc)
    new = _checkpoint(run, 2, b"weights at step 2")  # trained further: every stored cell is of step 1

    rope = next(r for r in compare.gather([tmp_path / "runs"]) if r.run_dir == run)
    assert (rope.status, rope.entries) == ("missing", [])
    assert "earlier checkpoint, not on step 2" in rope.error

    later = "2025-02-01T00:00:00+00:00"
    doc["entries"].append({**entry(16, 8.0), "checkpoint": new, "created": later})  # 1× measured again
    doc["entries"].append({**entry(32, 5.0), "checkpoint": {**new, "model_sha256": "0" * 64}, "created": later})
    doc["entries"].append({k: v for k, v in entry(64, 4.0).items() if k != "checkpoint"})  # checkpoint unknown
    save_results(run, doc)
    text = render(compare.gather([tmp_path / "runs"]))
    row = next(line for line in text.splitlines() if line.startswith("│ rope"))
    assert [c.strip() for c in row.split("│")[2:-1]] == ["8.000", "–", "–", "–"]
    assert "[missing]" not in text


def test_compare_cli_costs(sweep_dir: Path) -> None:
    """--costs adds each run's cost from its job's profile.json ('–' where a run has none)."""
    profile = {"schema_version": 1, "seconds": {"setup": 1.0, "steps": 9.0, "eval L=16": 0.5, "eval L=64": 2.5}}
    (sweep_dir / "train/pos=rope/profile.json").write_text(json.dumps(profile))
    result = runner.invoke(app, ["compare", str(sweep_dir), "--costs"], terminal_width=200)
    assert result.exit_code == 0, result.output
    rope_row = next(line for line in result.output.splitlines() if "Cost per run" not in line and "│ rope " in line
                    and "(L=64)" in line)  # fmt: skip
    assert "10.0" in rope_row and "2.5 (L=64)" in rope_row
    assert "Cost per run" in result.output
