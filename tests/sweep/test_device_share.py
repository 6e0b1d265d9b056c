"""Jobs sharing one device: threads per job, the memory check before a job starts on a (fake) GPU, the one-line
reasons of a job that does not fit, and a parallel sweep's results equal to the sequential sweep's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from filelock import FileLock, Timeout
from launchers import needs_joblib
from sweep_utils import MICRO_MODEL, ONE_STAGE
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.run.config_compose import compose_config, compose_dict
from posenc_cli.sweep import device_share, job
from posenc_cli.sweep.device_share import NotEnoughDeviceMemory, job_need_bytes, job_threads, start_slot
from posenc_cli.sweep.hydra_bridge import JobInfo
from posenc_cli.sweep.markers import FAILED_FILE

pytestmark = pytest.mark.integration  # end to end (sweeps, launchers, DDP, compile): not in the fast lane

GiB = 2**30


@pytest.mark.parametrize(
    ("n_jobs", "cores", "threads"),
    [(1, 16, 16), (2, 16, 8), (5, 16, 3), (-1, 16, 1), (-15, 16, 8), (-20, 2, 2), (4, 2, 1)],
)
def test_threads_per_job_share_the_cores_once(n_jobs: int, cores: int, threads: int) -> None:
    """joblib's negative n_jobs count from the cores: -1 is a job per core, -15 of 16 cores two jobs."""
    assert job_threads(n_jobs, cores) == threads


@pytest.mark.parametrize(("n_jobs", "cores", "free", "threads"), [(2, 16, 8, 4), (-1, 16, 8, 1), (2, 2, 1, 1)])
def test_threads_per_job_share_the_free_cores(n_jobs: int, cores: int, free: int, threads: int) -> None:
    """With cores taken by other processes the jobs divide what is left; joblib still counts jobs from all cores."""
    assert job_threads(n_jobs, cores, free) == threads


class FakeGPU:
    """A CUDA device that is not there: its free memory follows `free` (one value per query, the last repeated),
    and a clock that `sleep` advances."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, free: list[float], total: float = 80) -> None:
        self.free, self.total, self.queries, self.now, self.sleeps = list(free), total, 0, 0.0, []
        monkeypatch.setattr(device_share, "resolve_device", lambda name: torch.device("cuda", 0))
        monkeypatch.setattr(device_share, "device_memory", self.memory)
        monkeypatch.setattr(device_share, "_clock", lambda: self.now)
        monkeypatch.setattr(device_share, "_sleep", self.sleep)

    def memory(self, device: torch.device) -> tuple[int, int]:
        value = self.free[min(self.queries, len(self.free) - 1)]
        self.queries += 1
        return int(value * GiB), int(self.total * GiB)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def cfg() -> Any:
    return compose_config(["model=tiny", "train.device=cpu"])


def test_on_a_cpu_nothing_is_checked(cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_gpu(device: torch.device) -> tuple[int, int]:
        raise AssertionError("no device memory to query on a CPU")

    monkeypatch.setattr(device_share, "device_memory", no_gpu)
    with start_slot(cfg, tmp_path, parallel_jobs=4) as release:
        release()
    assert list(tmp_path.iterdir()) == []


def test_one_job_at_a_time_is_not_checked(cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGPU(monkeypatch, free=[0.0])
    with start_slot(cfg, tmp_path, parallel_jobs=1):
        pass
    assert gpu.queries == 0


def _held(lock_path: Path) -> bool:
    try:
        FileLock(lock_path).acquire(timeout=0)
    except Timeout:
        return True
    return False


def test_a_job_that_fits_starts_at_once_and_holds_the_start_until_released(
    cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = FakeGPU(monkeypatch, free=[40.0])
    said: list[str] = []
    lock = tmp_path / ".gpu-start-cuda0.lock"
    with start_slot(cfg, tmp_path, parallel_jobs=3, say=said.append) as release:
        assert _held(lock)  # a second job's start waits here
        release()  # after the first training step
        assert not _held(lock)
    assert said == [] and gpu.sleeps == []


def test_a_job_waits_until_its_memory_is_free(cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGPU(monkeypatch, free=[0.5, 0.5, 0.5, 30.0])
    said: list[str] = []
    with start_slot(cfg, tmp_path, parallel_jobs=3, say=said.append):
        pass
    assert gpu.queries == 4 and len(gpu.sleeps) == 3
    assert len(said) == 1 and said[0].startswith("waiting for 1.") and "0.5 GiB free now" in said[0]


def test_a_job_that_never_fits_fails_with_its_reason(cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(device_share.WAIT_ENV, "30")
    gpu = FakeGPU(monkeypatch, free=[0.5])
    reason = r"0.5 GiB stayed free for 30 s .* hydra.launcher.n_jobs \(now 3\)"
    with pytest.raises(NotEnoughDeviceMemory, match=reason), start_slot(cfg, tmp_path, 3, say=lambda text: None):
        raise AssertionError("the job must not start")
    assert gpu.now == 30
    assert not _held(tmp_path / ".gpu-start-cuda0.lock")


def test_a_job_larger_than_the_device_fails_at_once(cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGPU(monkeypatch, free=[0.5], total=0.75)
    with pytest.raises(NotEnoughDeviceMemory, match="has 0.8 GiB in all"), start_slot(cfg, tmp_path, 2):
        pass
    assert gpu.sleeps == []


def test_the_estimate_grows_with_the_model_and_the_batch() -> None:
    tiny, small = compose_config(["model=tiny"]), compose_config(["model=small"])
    wide = compose_config(["model=tiny", "train.batch_size=64"])
    assert device_share.CONTEXT_BYTES < job_need_bytes(tiny) < job_need_bytes(small)
    assert job_need_bytes(tiny) < job_need_bytes(wide)


def test_the_start_is_released_after_the_first_step() -> None:
    released: list[int] = []
    seen: list[str] = []
    callback = device_share.released_after_first_step(lambda e: seen.append(e["event"]), lambda: released.append(1))
    for event in ("data", "start"):
        callback({"event": event})
    assert released == []
    for event in ("step", "step", "eval", "end"):
        callback({"event": event})
        assert released == [1]
    assert seen == ["data", "start", "step", "step", "eval", "end"] and released == [1]


@pytest.fixture
def job_raw(tmp_path: Path) -> Iterator[dict[str, Any]]:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    overrides = ["model.d_model=32", "model.n_layer=2", "model.n_head=2", "data=text", f"data.paths=[{corpus}]"]
    overrides += ["train.steps=2", "train.seq_len=16", "train.batch_size=4", "train.device=cpu", "train.threads=1"]
    yield compose_dict(overrides)


def test_a_sweep_job_that_does_not_fit_records_why_and_does_not_train(
    job_raw: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(device_share.WAIT_ENV, "0")
    FakeGPU(monkeypatch, free=[0.1])
    monkeypatch.setattr(job, "train", lambda *a, **k: pytest.fail("the job must not train"))
    job_dir = tmp_path / "sweep" / "train" / "pos=rope"
    info = JobInfo(output_dir=job_dir, name="pos=rope", parallel_jobs=2, overrides=("pos=rope",))
    result = job.run_job(job_raw, info)
    assert result["status"] == "failed"
    error = json.loads((job_dir / FAILED_FILE).read_text())["error"]
    assert error.startswith("NotEnoughDeviceMemory: this job needs about 1.") and "n_jobs (now 2)" in error


def test_a_job_out_of_device_memory_records_one_line(
    job_raw: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def oom(*args: Any, **kwargs: Any) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nOf the allocated memory ...")

    monkeypatch.setattr(job, "train", oom)
    job_dir = tmp_path / "sweep" / "train" / "default"
    result = job.run_job(job_raw, JobInfo(output_dir=job_dir, name="", parallel_jobs=3))
    error = json.loads((job_dir / FAILED_FILE).read_text())["error"]
    assert result["error"] == error and "\n" not in error
    assert error.startswith("out of device memory with 3 jobs sharing the device (CUDA out of memory. Tried to")
    assert "lower hydra.launcher.n_jobs" in error


@needs_joblib
def test_parallel_jobs_give_the_sequential_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two jobs at once in joblib's worker processes (fp32, one thread each) measure what one after another do."""
    (tmp_path / "corpus").mkdir()
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    (tmp_path / "corpus" / "doc.txt").write_text(" ".join(words[(j * j) % len(words)] for j in range(3000)))
    (tmp_path / "cfg" / "model").mkdir(parents=True)
    (tmp_path / "cfg" / "sweep").mkdir()
    (tmp_path / "cfg" / "model" / "micro.yaml").write_text(MICRO_MODEL)
    (tmp_path / "cfg" / "sweep" / "one.yaml").write_text(ONE_STAGE)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for out, launcher in (("seq", []), ("par", ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"])):
        args = ["sweep", "one", *launcher, "--out", out, "--config-dir", str(tmp_path / "cfg")]
        result = runner.invoke(app, args, terminal_width=200)
        assert result.exit_code == 0, result.output
    for name in ("pos=nope", "pos=alibi"):
        seq, par = (
            json.loads((tmp_path / d / "train" / name / "eval" / "extrapolate.json").read_text())
            for d in ("seq", "par")
        )
        assert _numbers(seq) == _numbers(par) and _numbers(seq), name
        sha = [[e["checkpoint"]["model_sha256"] for e in doc["entries"]] for doc in (seq, par)]
        assert sha[0] == sha[1], name  # the same weights, to the bit


def _numbers(doc: Any) -> list[float]:
    """Every float of an evaluation record, in order (timings and dates left out)."""
    if isinstance(doc, dict):
        return [x for k, v in sorted(doc.items()) if "second" not in k and "time" not in k for x in _numbers(v)]
    if isinstance(doc, list):
        return [x for v in doc for x in _numbers(v)]
    return [doc] if isinstance(doc, float) else []


def test_a_job_left_at_threads_0_takes_the_free_cores_the_sweep_measured() -> None:
    from posenc_cli.sweep.job import _job_threads

    assert _job_threads({"free_cores": 1}, parallel_jobs=1) == 1
    assert _job_threads({"free_cores": 1}, parallel_jobs=2) == 1
    assert _job_threads({"free_cores": 64}, parallel_jobs=1) == torch.get_num_threads()  # never above torch's
