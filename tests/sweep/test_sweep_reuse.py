"""A later stage's job with exactly the config of a done job of an earlier stage is copied from it, not retrained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc_cli.run.journal import commit_checkpoint
from posenc_cli.sweep import runner as sweep_runner
from posenc_cli.sweep.markers import job_status, mark_done
from posenc_cli.sweep.plan import StagePlan, plan_sweep
from posenc_cli.sweep.reuse import REUSED_FILE
from posenc_cli.sweep.spec import load_sweep_spec

GRID = """
overrides: [model=tiny, train.steps=5]
stages:
  - name: grid
    action: select
    params: {pos: "rope,alibi", train.lr: "1e-3,3e-3"}
    select: {metric: val_loss}
  - name: seeds
    after: grid
    params: {train.seed: "0,1"}
"""


def finish(job_dir: Path, val_loss: float, weights: bytes) -> None:
    meta = {"kind": "posenc-run", "schema_version": 1, "steps": 4, "status": "complete", "step": 4}
    commit_checkpoint(job_dir, {"model.safetensors": weights}, {**meta, "val_loss": val_loss})
    (job_dir / "eval").mkdir()
    (job_dir / "eval" / "cells.json").write_text("[1]")
    mark_done(job_dir, job_dir.name)


@pytest.mark.integration  # a sweep run
def test_seed_zero_of_the_pick_is_the_grid_run_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "mine.yaml").write_text(GRID)
    spec = load_sweep_spec(tmp_path / "sweep" / "mine.yaml")
    sweep_dir = tmp_path / "out"
    trained: list[str] = []

    def fake_stage(plan: StagePlan, sweep_dir: Path, *args: object) -> None:  # what would train
        trained.extend(j.key for j in plan.jobs if job_status(j.dir(sweep_dir)) != "done")

    monkeypatch.setattr(sweep_runner, "_run_stage", fake_stage)
    grid = plan_sweep(spec, [])[0]
    losses = {"pos=rope,train.lr=0.001": 2.0, "pos=rope,train.lr=0.003": 1.0}
    losses |= {"pos=alibi,train.lr=0.001": 1.0, "pos=alibi,train.lr=0.003": 3.0}
    for job in grid.jobs:
        finish(job.dir(sweep_dir), losses[job.name], job.name.encode())
    events: list[str] = []
    sweep_runner.run_sweep(spec, [], sweep_dir, on_event=lambda kind, text: events.append(f"{kind} {text}"))

    rope0 = sweep_dir / "seeds" / "train.lr=0.003" / "pos=rope,train.seed=0"
    alibi0 = sweep_dir / "seeds" / "train.lr=0.001" / "pos=alibi,train.seed=0"
    for copy, source in ((rope0, "grid/pos=rope,train.lr=0.003"), (alibi0, "grid/pos=alibi,train.lr=0.001")):
        assert job_status(copy) == "done"
        assert (copy / "model.safetensors").read_bytes() == (sweep_dir / source / "model.safetensors").read_bytes()
        assert (copy / "eval" / "cells.json").read_text() == "[1]"
        assert json.loads((copy / REUSED_FILE).read_text()) == {"copied_from": source}
        assert json.loads((copy / "done.json").read_text())["job"] == copy.name  # its own marker
        assert job_status(sweep_dir / source) == "done"  # the source is untouched
    assert not [p for p in rope0.parent.iterdir() if p.name.startswith(".")]  # no staging directory left
    # Only seed 1 is left to train; the grid's other points are not copied anywhere.
    assert sorted(k for k in trained if k.startswith("seeds/")) == [
        "seeds/train.lr=0.001/pos=alibi,train.seed=1",
        "seeds/train.lr=0.003/pos=rope,train.seed=1",
    ]
    assert any("reuse seeds/train.lr=0.003/pos=rope,train.seed=0: the same config as grid/" in e for e in events)


@pytest.mark.integration  # a sweep run
def test_a_job_with_another_config_is_never_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "mine.yaml").write_text(GRID.replace('"0,1"', '"1,2"'))
    spec = load_sweep_spec(tmp_path / "sweep" / "mine.yaml")
    sweep_dir = tmp_path / "out"
    monkeypatch.setattr(sweep_runner, "_run_stage", lambda *args: None)
    for job in plan_sweep(spec, [])[0].jobs:
        finish(job.dir(sweep_dir), 1.0, b"w")
    sweep_runner.run_sweep(spec, [], sweep_dir)
    assert not list((sweep_dir / "seeds").rglob(REUSED_FILE))
