"""The sweep's time account: phase booking from train/eval events, aggregation over job profiles, `--profile`."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from sweep_utils import MICRO_MODEL
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.perf import profiling
from posenc_cli.perf.profiling import (
    PROFILE_FILE,
    EvalRecorder,
    JobProfile,
    StageClock,
    TrainRecorder,
    aggregate,
    forward_flops_per_token,
    summary_rows,
    train_flops_per_token,
    write_job_profile,
)

MODEL = SimpleNamespace(n_layer=2, d_model=32)
CFG = SimpleNamespace(model=MODEL, train=SimpleNamespace(seq_len=16, eval_batches=2, batch_size=4))


def test_flops_per_token_match_the_bench_convention() -> None:
    from posenc_cli.perf.bench import train_flops_per_token as bench_flops

    assert train_flops_per_token(1000, 2, 32, 16) == bench_flops(1000, 2, 32, 16) == 6 * 1000 + 6 * 2 * 32 * 16
    assert forward_flops_per_token(1000, 2, 32, 16) == 2 * 1000 + 2 * 2 * 32 * 16


def test_train_recorder_books_phases_and_passes_events_on() -> None:
    seen: list[str] = []
    profile = JobProfile()
    rec = TrainRecorder(profile, CFG, inner=lambda e: seen.append(e["event"]))
    rec({"event": "checkpoint", "step": 0, "status": "running", "seconds": 0.0})  # the first save, before start
    start = {"event": "start", "step": 0, "steps": 10, "precision": "fp32", "threads": 2, "device": "cpu"}
    rec(start | {"n_params": 1000, "tokens_per_step": 64, "seq_len": 16})
    rec({"event": "eval", "step": 5, "val_loss": 1.0, "seconds": 0.25})
    rec({"event": "checkpoint", "step": 10, "status": "complete", "seconds": 0.5})
    rec({"event": "end", "result": SimpleNamespace(step=10, tokens_per_s=320.0)})
    assert seen == ["checkpoint", "start", "eval", "checkpoint", "end"]
    assert profile.seconds["steps"] == pytest.approx(640 / 320.0)  # 10 steps x 64 tokens at 320 tokens/s
    assert profile.flops["steps"] == 640 * train_flops_per_token(1000, 2, 32, 16)
    assert profile.seconds["validation"] == 0.25
    assert profile.flops["validation"] == 2 * 4 * 16 * forward_flops_per_token(1000, 2, 32, 16)
    assert profile.seconds["checkpoints"] == 0.5
    assert profile.seconds["setup"] >= 0
    assert profile.facts["peak_key"] == "fp32@2"


def test_padded_rows_book_the_time_of_the_real_tokens() -> None:
    """Under train.packing=none rows are padded and tokens/s counts the real tokens only: the booked time is the
    session's real tokens over that rate (it was the padded count over it, twice the wall time of a tasks job)."""
    profile = JobProfile()
    rec = TrainRecorder(profile, CFG)
    start = {"event": "start", "step": 4, "steps": 10, "precision": "fp32", "threads": 1, "device": "cpu"}
    rec(start | {"n_params": 1000, "tokens_per_step": 64, "tokens": 100, "seq_len": 16})
    rec({"event": "end", "result": SimpleNamespace(step=10, tokens=100 + 192, tokens_per_s=96.0)})  # half padding
    assert profile.seconds["steps"] == pytest.approx(192 / 96.0)  # not 6 x 64 / 96
    assert profile.flops["steps"] == 6 * 64 * train_flops_per_token(1000, 2, 32, 16)  # padding is computed


def test_eval_recorder_books_each_length_and_its_flops() -> None:
    profile = JobProfile()
    weights = torch.nn.Linear(100, 10)  # 1010 parameters
    rec = EvalRecorder(profile, SimpleNamespace(config=SimpleNamespace(model=MODEL), model=weights))
    rec("L=16", 1, 2)
    rec("L=16", 2, 2)
    rec("L=32", 1, 1)
    rec.book_flops(
        [
            {"length": 16, "status": "ok", "tokens": 64, "stride": None},
            {"length": 32, "status": "ok", "tokens": 32, "stride": 8},  # sliding: 4 windows of 32 read
            {"length": 64, "status": "ok", "tokens": 64, "stride": None},  # reused: no time booked, no FLOPs
        ]
    )
    assert set(profile.seconds) == {"eval L=16", "eval L=32"}
    assert profile.flops["eval L=16"] == 64 * forward_flops_per_token(1010, 2, 32, 16)
    assert profile.flops["eval L=32"] == 4 * 32 * forward_flops_per_token(1010, 2, 32, 32)


def test_stage_clock_times_launched_stages() -> None:
    printed: list[str] = []
    clock = StageClock(lambda kind, text: printed.append(kind))
    clock("run", "stage train: 2 of 2 job(s) to run")
    clock("skip", "stage extend: all 1 job(s) already done")
    clock("run", "stage eval from train/pos=rope: 1 of 1 job(s) to run")
    clock.finish()
    assert printed == ["run", "skip", "run"]
    assert [s["stage"] for s in clock.stages] == ["stage train", "stage eval from train/pos=rope"]
    assert clock.plan_s is not None and clock.plan_s >= 0


def test_aggregate_sums_jobs_and_rates_them_against_their_peak(tmp_path: Path) -> None:
    for name, secs in (("a", 2.0), ("b", 6.0)):
        prof = JobProfile(facts={"precision": "fp32", "threads": 1, "peak_key": "fp32@1"})
        prof.add("steps", secs, flops=secs * 5e9)  # 5 GFLOP/s
        prof.add("eval L=256", 1.0, flops=1e9)
        prof.add("eval L=32", 1.0)
        write_job_profile(tmp_path / name, prof, wall_s=secs + 2)
    doc = aggregate(tmp_path, [("train", tmp_path / "a"), ("train", tmp_path / "b"), ("train", tmp_path / "c")], {}, [])
    assert doc["missing"] == ["c"]
    steps = doc["phases"]["steps"]
    assert steps["seconds"] == 8.0 and steps["gflops_per_s"] == pytest.approx(5.0) and steps["efficiency"] is None
    doc = aggregate(tmp_path, [("train", tmp_path / "a"), ("train", tmp_path / "b")], {}, [], {"fp32@1": 20.0})
    assert doc["phases"]["steps"]["efficiency"] == pytest.approx(0.25)
    assert [r["phase"] for r in summary_rows(doc)] == ["steps", "eval L=32", "eval L=256"]


def test_unreadable_job_profile_is_missing_not_an_error(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / PROFILE_FILE).write_text("{not json")
    assert aggregate(tmp_path, [("train", tmp_path / "a")], {}, [])["missing"] == ["a"]


def test_measure_peaks_probes_each_dtype_and_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiling, "matmul_size", lambda *a, **k: 64)  # bench's, as profiling imported it
    peaks = profiling.measure_peaks({"fp32@1", "bf16@1", "fp32@cuda", "int8@1"})
    assert set(peaks) <= {"fp32@1", "bf16@1", "fp32@cuda"} and {"fp32@1", "bf16@1"} <= set(peaks)
    assert all(v > 0 for v in peaks.values())


@pytest.mark.integration  # a sweep run
def test_sweep_writes_profiles_and_prints_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "corpus").mkdir()
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"]
    for i in range(4):
        (tmp_path / "corpus" / f"d{i}.txt").write_text(" ".join(words[(i + j * j) % 7] for j in range(500)))
    (tmp_path / "cfg" / "model").mkdir(parents=True)
    (tmp_path / "cfg" / "sweep").mkdir()
    (tmp_path / "cfg" / "model" / "micro.yaml").write_text(MICRO_MODEL)
    (tmp_path / "cfg" / "sweep" / "p.yaml").write_text(
        "overrides: [model=micro, data=text, 'data.paths=[corpus]', train.steps=4, train.warmup_steps=1, "
        "train.seq_len=16, train.batch_size=4, train.eval_every=2, train.eval_batches=2, train.save_every=4, "
        "train.precision=fp32, train.threads=1, eval.tokens=128, 'eval.lengths=[1,2]']\n"
        "stages:\n  - name: train\n    params: {pos: rope}\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(profiling, "measure_peaks", lambda keys: dict.fromkeys(keys, 100.0))
    args = ["sweep", "p", "--out", "s", "--profile", "--config-dir", str(tmp_path / "cfg")]
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    job = json.loads((tmp_path / "s/train/default" / PROFILE_FILE).read_text())
    assert {"setup", "steps", "validation", "checkpoints", "eval load", "eval L=16", "eval L=32"} <= set(job["seconds"])
    assert job["flops"]["steps"] == 4 * 64 * train_flops_per_token(job["n_params"], 2, 32, 16)
    doc = json.loads((tmp_path / "s" / PROFILE_FILE).read_text())
    assert doc["missing"] == [] and doc["stages"][0]["stage"] == "stage train"
    assert {"plan", "start-up", "report"} <= set(doc["parent"])
    assert doc["phases"]["steps"]["efficiency"] > 0 and doc["total"]["flops"] > 0
    assert "where the time went" in result.output and "eval L=32" in result.output
    assert "whole sweep" in result.output


def test_the_whole_sweep_is_held_against_the_device_its_jobs_ran_on(monkeypatch) -> None:
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    assert profiling.machine_peak_key("bf16@cuda") == "bf16@cuda"  # was bf16@16: a GPU sweep against the CPU's peak
    assert profiling.machine_peak_key("fp32@1") == "fp32@16"
