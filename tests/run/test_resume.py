"""Exact resume: interrupted runs finish bitwise identical to uninterrupted ones; kills never break a checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_utils import metrics, same_weights, tiny_config, tiny_overrides, weights, write_corpus

import posenc_cli.run.train as train_mod
from posenc_cli.run.layout import PENDING
from posenc_cli.run.load import load_run
from posenc_cli.run.meta import read_meta
from posenc_cli.run.resume_state import restore_rng
from posenc_cli.run.train import train

# dropout and grad accumulation make the comparison sensitive to every RNG stream and to the batch order
STEPS = dict(steps=24, save_every=5, grad_accum=2)
MODEL = {"dropout": 0.1}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run every interrupted one is compared with."""
    run = tmp_path_factory.mktemp("ref") / "run"
    train(tiny_config(corpus, model=MODEL, **STEPS), run)
    return run


def _signal_at(step: int, signum: int = signal.SIGTERM):
    def callback(event: dict) -> None:
        if event["event"] == "step" and event["step"] == step:
            os.kill(os.getpid(), signum)

    return callback


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_and_resume_is_bitwise_identical(corpus: Path, reference: Path, tmp_path: Path, signum) -> None:
    cfg = tiny_config(corpus, model=MODEL, **STEPS)
    run = tmp_path / "run"
    stopped = train(cfg, run, callback=_signal_at(12, signum))  # 12 is not a save_every multiple
    assert stopped.stopped_reason == "interrupted" and stopped.step == 12 and stopped.signal == signum
    assert read_meta(run)["status"] == "interrupted" and read_meta(run)["step"] == 12
    done = train(cfg, run, resume=True)
    assert done.stopped_reason == "complete" and done.step == 24
    assert same_weights(weights(run), weights(reference))
    assert metrics(run) == metrics(reference)  # identical losses, no step twice


def test_crash_between_checkpoints_cuts_metrics_back(corpus: Path, reference: Path, tmp_path: Path) -> None:
    cfg = tiny_config(corpus, model=MODEL, **STEPS)
    run = tmp_path / "run"

    def crash(event: dict) -> None:
        if event["event"] == "step" and event["step"] == 13:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, run, callback=crash)
    assert read_meta(run)["step"] == 10 and max(m[0] for m in metrics(run)) == 13
    train(cfg, run)  # same --out: continues from step 10
    assert [m[0] for m in metrics(run)] == list(range(1, 25))
    assert same_weights(weights(run), weights(reference))
    assert metrics(run) == metrics(reference)


def test_control_without_sampler_state_the_runs_differ(
    corpus: Path, reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The equality above is not vacuous: skipping the sampler-generator restore breaks it."""

    def restore_all_but_sampler(tensors, info, sampler, sampler_too: bool = True) -> None:
        restore_rng(tensors, info, sampler, sampler_too=False)

    cfg = tiny_config(corpus, model=MODEL, **STEPS)
    run = tmp_path / "run"
    train(cfg, run, callback=_signal_at(12))
    monkeypatch.setattr(train_mod, "restore_rng", restore_all_but_sampler)
    train(cfg, run, resume=True)
    assert not same_weights(weights(run), weights(reference))
    assert metrics(run)[:12] == metrics(reference)[:12] and metrics(run)[12:] != metrics(reference)[12:]


@pytest.mark.parametrize("phase", ["writing", "renaming"])
def test_kill_during_a_save_leaves_a_loadable_checkpoint(
    corpus: Path, reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, phase: str
) -> None:
    """os.replace fails inside the step-10 save: while the new files are written into .pending (before the commit
    point) the step-5 checkpoint stays; while they are renamed into place (after it) step 10 is the checkpoint."""
    cfg = tiny_config(corpus, model=MODEL, **STEPS)
    run = tmp_path / "run"
    real_replace = os.replace
    armed = {"on": False}

    def failing_replace(src, dst, *args, **kwargs):
        dst_dir = Path(dst).parent.name
        in_write = dst_dir == PENDING and Path(dst).name == "state.safetensors"
        in_apply = dst_dir == run.name and Path(dst).name == "state.safetensors"
        if armed["on"] and ((phase == "writing" and in_write) or (phase == "renaming" and in_apply)):
            raise OSError("simulated kill during save")
        return real_replace(src, dst, *args, **kwargs)

    def arm(event: dict) -> None:
        if event["event"] == "step" and event["step"] == 10:
            armed["on"] = True

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated kill"):
        train(cfg, run, callback=arm)
    monkeypatch.setattr(os, "replace", real_replace)
    expected = 5 if phase == "writing" else 10
    loaded = load_run(run, complete_only=False)  # consistent: checksums of every file match meta.json
    assert loaded.meta.step == expected
    assert (run / PENDING).exists()  # the interrupted save left its journal behind
    train(cfg, run)
    assert not (run / PENDING).exists()
    assert same_weights(weights(run), weights(reference))
    assert metrics(run) == metrics(reference)


@pytest.mark.integration  # end to end
def test_sigterm_in_a_subprocess_saves_and_the_run_resumes(corpus: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    overrides = tiny_overrides(corpus, steps=100_000, save_every=100_000, eval_every=100_000)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "posenc_cli", "train", *overrides, "--out", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if (run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Interrupted by SIGTERM" in err and f"posenc train --resume {run}" in err
    loaded = load_run(run, complete_only=False)
    step = loaded.meta.step
    assert loaded.meta.status == "interrupted" and step >= 3
    assert max(m[0] for m in metrics(run)) == step
    cfg = tiny_config(corpus, steps=step + 4, save_every=100_000, eval_every=100_000)
    done = train(cfg, run, resume=True, force_config=True)  # same run, now with a reachable end
    assert done.stopped_reason == "complete" and done.step == step + 4
    assert [m[0] for m in metrics(run)] == list(range(1, step + 5))


def _signal_at_batch(monkeypatch: pytest.MonkeyPatch, call: int, limit: int | None = None) -> list[int]:
    """SIGTERM while drawing micro-batch number `call` (1-based); past `limit` calls the test fails at once."""
    real, calls = train_mod._Trainer._batch, [0]

    def batch(self):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if limit is not None and calls[0] > limit:
            raise RuntimeError(f"still accumulating after {limit} micro-batches: the signal was not acted on")
        if calls[0] == call:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self)

    monkeypatch.setattr(train_mod._Trainer, "_batch", batch)
    return calls


def test_a_signal_within_a_huge_accumulation_stops_after_one_micro_step(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tiny_config(corpus, steps=1, grad_accum=10**6)  # one step of a million micro-batches
    calls = _signal_at_batch(monkeypatch, call=3, limit=10)
    stopped = train(cfg, tmp_path / "run")
    assert stopped.stopped_reason == "interrupted" and stopped.signal == signal.SIGTERM
    assert stopped.step == 0 and calls[0] == 3  # the micro-step under way finished, no further one started
    assert read_meta(tmp_path / "run")["status"] == "interrupted"


def test_a_signal_within_a_step_undoes_it_and_resume_is_bitwise_identical(
    corpus: Path, reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped in the first of step 13's two micro-batches: the partial gradients and random draws are dropped,
    the run saves step 12, and resuming replays step 13 whole, as the uninterrupted run did."""
    cfg = tiny_config(corpus, model=MODEL, **STEPS)
    run = tmp_path / "run"
    _signal_at_batch(monkeypatch, call=2 * 12 + 1)
    stopped = train(cfg, run)
    assert stopped.stopped_reason == "interrupted" and stopped.step == 12
    monkeypatch.undo()
    train(cfg, run, resume=True)
    assert same_weights(weights(run), weights(reference))
    assert metrics(run) == metrics(reference)


def test_auto_precision_continues_in_the_precision_the_run_trained_in(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resumed where `auto` would decide otherwise (another machine), a run keeps its one precision and label."""
    import posenc_cli.run.device as device

    cfg = tiny_config(corpus, steps=4, save_every=2, precision="auto")
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: True)
    assert train(cfg, tmp_path / "run", callback=_signal_at(2)).precision == "bf16"
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: False)  # the machine it continues on
    done = train(cfg, tmp_path / "run", resume=True)
    assert done.precision == "bf16" and read_meta(tmp_path / "run")["precision"] == "bf16"
    assert train(tiny_config(corpus, steps=4, precision="auto"), tmp_path / "fresh").precision == "fp32"
