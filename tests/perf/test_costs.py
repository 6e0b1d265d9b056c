"""Run costs read back from profile.json and meta.json, and their table."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rich.console import Console

from posenc_cli.perf.costs import run_cost, run_costs
from posenc_cli.report.tables import cost_table


def _job(tmp: Path, name: str, seconds: dict[str, float], tokens: int | None) -> Path:
    run = tmp / name
    run.mkdir()
    (run / "profile.json").write_text(json.dumps({"schema_version": 1, "seconds": seconds, "flops": {}}))
    if tokens is not None:
        (run / "meta.json").write_text(json.dumps({"kind": "posenc-run", "tokens": tokens}))
    return run


def test_fine_tune_extend_and_longest_eval(tmp_path: Path) -> None:
    ft = _job(tmp_path, "ft", {"setup": 0.5, "steps": 3.0, "validation": 0.25, "checkpoints": 0.25, "extend": 0.1,
                               "eval load": 0.2, "eval L=128": 1.0, "eval L=2048": 4.5}, 491520)  # fmt: skip
    cost = run_cost("yarn ft", ft)
    assert cost == run_costs([("yarn ft", ft)])[0]
    assert (cost.train_tokens, cost.train_s, cost.extend_s) == (491520, 4.0, 0.1)
    assert (cost.eval_length, cost.eval_s) == (2048, 4.5)


def test_scaling_only_and_no_profile(tmp_path: Path) -> None:
    scaled = run_cost("ntk", _job(tmp_path, "ntk", {"extend": 0.05, "eval L=512": 2.0}, 819200))
    assert scaled.train_tokens is None and scaled.train_s is None and scaled.eval_s == 2.0
    (tmp_path / "bare").mkdir()
    bare = run_cost("bare", tmp_path / "bare")
    assert bare.train_s is bare.extend_s is bare.eval_s is bare.eval_length is None
    console = Console(width=160, record=True)
    console.print(cost_table([dataclasses.asdict(c) for c in (scaled, bare)]))
    text = console.export_text()
    assert "ntk" in text and "2.0 (L=512)" in text and "–" in text
