"""Device, precision and thread selection; the once-per-machine bf16 decision and its cache file."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import posenc_cli.run.device as device
from posenc_cli.cpu_load import default_threads, free_cores_now
from posenc_cli.errors import ConfigError


@pytest.fixture(autouse=True)
def precision_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test its own cache file and a fresh per-process decision (as a new process would start)."""
    path = tmp_path / "cache" / "precision.json"
    monkeypatch.setenv(device.CACHE_ENV, str(path))
    decide = device.cpu_has_fast_bf16  # tests may monkeypatch the name; clear the real one
    decide.cache_clear()
    yield path
    decide.cache_clear()


def test_auto_device_falls_back_to_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device, "_mps_available", lambda: False)
    assert device.resolve_device("auto") == torch.device("cpu")
    assert device.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="train.device=cuda but CUDA is not available"):
        device.resolve_device("cuda")
    with pytest.raises(ConfigError, match="train.device=mps but MPS is not available"):
        device.resolve_device("mps")


def test_explicit_precisions_and_auto_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert device.resolve_precision("fp32", cpu) == "fp32"
    assert device.resolve_precision("bf16", cpu) == "bf16"
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: True)
    assert device.resolve_precision("auto", cpu) == "bf16"
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: False)
    assert device.resolve_precision("auto", cpu) == "fp32"


def test_fast_bf16_needs_the_cpu_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(device, "cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setattr(device, "bf16_speedup", lambda: pytest.fail("no probe without bf16 instructions"))
    assert device.cpu_has_fast_bf16() is False
    assert not (tmp_path / "cache").exists()  # nothing measured, nothing stored
    monkeypatch.setattr(device, "cpu_flags", lambda: {"avx512_bf16"})
    for speedup, fast in [(0.5, False), (1.29, False), (3.0, True)]:  # flags present: the probe decides
        monkeypatch.setenv(device.CACHE_ENV, str(tmp_path / f"{speedup}.json"))
        monkeypatch.setattr(device, "bf16_speedup", lambda s=speedup: s)
        _new_process()
        assert device.cpu_has_fast_bf16() is fast


def test_bf16_speedup_probe_returns_a_ratio() -> None:
    assert device.bf16_speedup(size=32, rounds=2, reps=1) > 0


def _new_process() -> None:
    device.cpu_has_fast_bf16.cache_clear()  # what a new process starts with: nothing decided yet


def test_one_decision_per_machine_however_the_probe_jumps(
    monkeypatch: pytest.MonkeyPatch, precision_cache: Path
) -> None:
    """The six ratios one loaded machine's probe gave: every later process keeps the first decision."""
    monkeypatch.setattr(device, "cpu_flags", lambda: {"avx512_bf16", "amx_bf16"})
    ratios = iter([2.45, 1.98, 0.01, 4.37, 3.36, 303.5])
    monkeypatch.setattr(device, "bf16_speedup", lambda: next(ratios))
    decisions = []
    for _ in range(6):
        _new_process()
        decisions.append(device.cpu_has_fast_bf16())
    assert decisions == [True] * 6
    assert next(ratios) == 1.98  # measured once, by the first process; the others read the cache
    entry = json.loads(precision_cache.read_text())[device.machine_key()]
    assert entry["bf16"] is True and entry["speedup"] == 2.45 and entry["torch"] == torch.__version__


def _noisy_clock(fp32_s: float, bf16_s: float, rng: random.Random):  # type: ignore[no-untyped-def]
    """A stand-in for the probe's timing: the true time of each dtype, often inflated up to 300x by other
    processes taking the core (a loaded machine only ever makes a sample slower)."""

    def seconds(a: torch.Tensor, b: torch.Tensor, reps: int) -> float:
        true = fp32_s if a.dtype == torch.float32 else bf16_s
        return true * reps * (rng.uniform(1.0, 300.0) if rng.random() < 0.4 else rng.uniform(1.0, 1.1))

    return seconds


@pytest.mark.parametrize(("bf16_s", "fast"), [(0.4e-3, True), (30e-3, False)])  # AMX-fast, emulated
def test_the_probe_decides_the_same_way_under_a_noisy_clock(
    monkeypatch: pytest.MonkeyPatch, bf16_s: float, fast: bool
) -> None:
    for seed in range(40):
        monkeypatch.setattr(device, "_matmul_seconds", _noisy_clock(1e-3, bf16_s, random.Random(seed)))
        assert (device.bf16_speedup(size=8) >= device.BF16_MIN_SPEEDUP) is fast, f"seed {seed}"


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"KEY": {"bf16": "yes"}}', "\x00\xff"])
def test_a_corrupt_cache_is_measured_again_and_rewritten(
    monkeypatch: pytest.MonkeyPatch, precision_cache: Path, content: str
) -> None:
    monkeypatch.setattr(device, "cpu_flags", lambda: {"amx_bf16"})
    monkeypatch.setattr(device, "bf16_speedup", lambda: 0.5)
    precision_cache.parent.mkdir(parents=True)
    precision_cache.write_text(content.replace("KEY", device.machine_key()), encoding="latin-1")
    assert device.cpu_has_fast_bf16() is False
    assert json.loads(precision_cache.read_text())[device.machine_key()]["bf16"] is False


def test_an_unwritable_cache_still_decides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(device.CACHE_ENV, str(blocker / "precision.json"))  # its directory is a file
    monkeypatch.setattr(device, "cpu_flags", lambda: {"amx_bf16"})
    monkeypatch.setattr(device, "bf16_speedup", lambda: 3.0)
    assert device.cpu_has_fast_bf16() is True


def test_other_machines_keep_their_own_entries(monkeypatch: pytest.MonkeyPatch, precision_cache: Path) -> None:
    precision_cache.parent.mkdir(parents=True)
    precision_cache.write_text(json.dumps({"other cpu | flags 0 | torch 1.0": {"bf16": True}}))
    monkeypatch.setattr(device, "cpu_flags", lambda: {"amx_bf16"})
    monkeypatch.setattr(device, "bf16_speedup", lambda: 0.2)
    assert device.cpu_has_fast_bf16() is False
    doc = json.loads(precision_cache.read_text())
    assert doc["other cpu | flags 0 | torch 1.0"] == {"bf16": True} and doc[device.machine_key()]["bf16"] is False
    assert torch.__version__ in device.machine_key()  # another torch version measures again


_CHILD = """
import sys
import posenc_cli.run.device as device
device.cpu_flags = lambda: {"amx_bf16"}
device.bf16_speedup = lambda: sys.exit(3)  # a probe here would mean the cache was not read
print(device.cpu_has_fast_bf16())
"""


@pytest.mark.integration  # a second process
def test_another_process_reads_the_decision(monkeypatch: pytest.MonkeyPatch, precision_cache: Path) -> None:
    monkeypatch.setattr(device, "cpu_flags", lambda: {"amx_bf16"})
    monkeypatch.setattr(device, "bf16_speedup", lambda: 1.29)  # just under the margin: fp32
    assert device.cpu_has_fast_bf16() is False
    child = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "False"


def test_autocast_runs_matmuls_in_bf16_and_fp32_is_untouched() -> None:
    cpu = torch.device("cpu")
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with device.autocast(cpu, "bf16"):
        assert (a @ b).dtype == torch.bfloat16
    with device.autocast(cpu, "fp32"):
        assert (a @ b).dtype == torch.float32


def test_threads_context_restores_the_count() -> None:
    before = torch.get_num_threads()
    with device.threads(1) as n:
        assert n == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    with device.threads(0) as n:  # 0: the free cores this process measured, at most torch's count
        assert n == default_threads(free_cores_now(), before)
    assert torch.get_num_threads() == before


def test_cpu_flags_is_a_set() -> None:
    assert isinstance(device.cpu_flags(), set)
