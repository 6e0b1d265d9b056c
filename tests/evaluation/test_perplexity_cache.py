"""Stored evaluation cells are keyed by the checkpoint they measured, and concurrent writers keep each other's cells
(issue #16, items 3 and 6)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_perplexity import fake_corpus, fake_run

import posenc_cli.evaluation.tasks.extrapolate as extrapolate_task
from posenc_cli.config import EvalConfig
from posenc_cli.errors import CheckpointError
from posenc_cli.evaluation.perplexity.measuring import evaluate_model
from posenc_cli.evaluation.results import load_results, results_path
from posenc_cli.evaluation.tasks import passkey  # the passkey task: its cells and their key
from posenc_cli.evaluation.tasks.extrapolate import evaluate_run
from posenc_cli.run.interrupts import run_lock


def at_checkpoint(run, step: int, sha: str):
    run.meta = dataclasses.replace(run.meta, step=step, files={"model.safetensors": sha})
    return run


def test_more_training_measures_again_instead_of_reusing_stale_cells(tmp_path: Path) -> None:
    run = at_checkpoint(fake_run(tmp_path), 20, "a" * 64)
    cfg = EvalConfig(lengths=[1, 2], tokens=64)
    evaluate_run(run, cfg, corpus=fake_corpus())
    assert evaluate_run(run, cfg, corpus=fake_corpus())["reused"] == 2  # same checkpoint: reused

    at_checkpoint(run, 60, "b" * 64)  # train --resume ... train.steps=60 --force-config
    out = evaluate_run(run, EvalConfig(lengths=[1], tokens=64), corpus=fake_corpus())
    assert out["reused"] == 0
    doc = load_results(run.path)
    # the cells of the earlier weights are gone, not shown as if they measured these: length 2 is "not measured"
    assert [(e["length"], e["checkpoint"]) for e in doc["entries"]] == [(16, {"step": 60, "model_sha256": "b" * 64})]


def test_two_evaluations_of_one_run_keep_each_others_cells(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = at_checkpoint(fake_run(tmp_path), 20, "a" * 64)
    measure = evaluate_model
    started: list[bool] = []

    def measure_while_another_evaluation_writes(*args, **kwargs):
        if not started:  # the second evaluation runs and stores its cell while the first one is measuring
            started.append(True)
            evaluate_run(run, EvalConfig(lengths=[2], tokens=64), corpus=fake_corpus())
        return measure(*args, **kwargs)

    monkeypatch.setattr(extrapolate_task, "evaluate_model", measure_while_another_evaluation_writes)
    evaluate_run(run, EvalConfig(lengths=[1], tokens=64), corpus=fake_corpus())
    assert sorted(e["length"] for e in load_results(run.path)["entries"]) == [16, 32]


def test_a_run_being_trained_is_refused(tmp_path: Path) -> None:
    run = at_checkpoint(fake_run(tmp_path), 20, "a" * 64)
    with run_lock(run.path), pytest.raises(CheckpointError, match="being trained by another process"):
        evaluate_run(run, EvalConfig(lengths=[1], tokens=64), corpus=fake_corpus())
    assert not results_path(run.path).exists()
    evaluate_run(run, EvalConfig(lengths=[1], tokens=64), corpus=fake_corpus())  # training stopped: fine


def test_passkey_cells_are_keyed_by_checkpoint() -> None:
    cell = {"length": 64, "depth": 0.5, "trials": 2, "digits": 5, "seed": 0, "dtype": "fp32"}
    before = {**cell, "checkpoint": {"step": 20, "model_sha256": "a" * 64}}
    after = {**cell, "checkpoint": {"step": 60, "model_sha256": "b" * 64}}
    assert passkey.entry_key(before) != passkey.entry_key(after)
    assert passkey.entry_key(before) == passkey.entry_key(dict(before))
