"""Where and in which precision a run computes: device choice, CPU threads, bf16 autocast.

`precision=auto` picks bf16 autocast only where it is actually fast: on CUDA when the GPU supports bf16, and on CPU
when the CPU has bf16 matrix instructions (AMX or AVX512-BF16) *and* a timed matmul probe confirms that bf16
beats fp32. Without those instructions PyTorch emulates bf16 matmuls, which can be tens of times slower than fp32
(on an AVX2-only AMD EPYC, a 512² bf16 matmul is ~60× slower). Master weights stay fp32 in every case.

The probe runs once per machine, not per process: a single timing on a loaded machine is a race (one probe gave
ratios from 0.01 to 303 in six calls, and one evaluation ran in fp32 and then in bf16), so the decision is stored
in a small JSON file (`precision_cache_path()`, keyed by CPU model, CPU flags and torch version) and reused by
every later training and evaluation on the machine.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import platform
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import torch
from filelock import FileLock, Timeout
from torch import Tensor

from posenc_cli.cpu_load import default_threads, free_cores_now
from posenc_cli.errors import ConfigError
from posenc_cli.fsutil import atomic_write_json

Precision = Literal["fp32", "bf16"]

_BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def resolve_device(name: str | torch.device, option: str = "train.device") -> torch.device:
    """'auto' -> cuda, else mps, else cpu; an explicit device that is not available is a `ConfigError` naming the
    setting the user gave: `option` is a config key (`train.device=cuda`) or a flag (`--device cuda`)."""
    if isinstance(name, torch.device):
        return name
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")

    def given(value: str) -> str:
        return f"{option} {value}" if option.startswith("-") else f"{option}={value}"

    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{given(name)} but CUDA is not available (use {given('auto')} or cpu)")
    if name == "mps" and not _mps_available():
        raise ConfigError(f"{given('mps')} but MPS is not available (use {given('auto')} or cpu)")
    try:
        return torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"unknown device '{name}' (use auto, cpu, cuda or mps)") from e


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def set_threads(n: int) -> int:
    """Use `n` intra-op CPU threads (0: the cores other processes leave free, at most torch's count now:
    `cpu_load.default_threads`); returns the count in use."""
    if n <= 0:
        n = default_threads(free_cores_now(), torch.get_num_threads())
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def resolve_precision(precision: str, device: torch.device) -> Precision:
    """The precision a run computes in: 'fp32' or 'bf16' (autocast over fp32 master weights)."""
    if precision == "fp32":
        return "fp32"
    if precision == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError("train.precision=bf16 but this GPU does not support bf16 (use fp32 or auto)")
        return "bf16"
    if precision != "auto":
        raise ConfigError(f"train.precision={precision!r} is not one of fp32, bf16, auto")
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu":
        return "bf16" if cpu_has_fast_bf16() else "fp32"
    return "fp32"  # mps: bf16 autocast support varies by OS version; fp32 is the safe default


def autocast(device: torch.device, precision: Precision) -> contextlib.AbstractContextManager[None]:
    """bf16 autocast on `device` for precision 'bf16', else a no-op context."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def cpu_flags() -> set[str]:
    """CPU feature flags from /proc/cpuinfo (empty where that file does not exist, e.g. macOS)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (or `platform.processor()`), '' when unknown."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def describe_device(device: torch.device) -> str:
    """'cpu (AMD EPYC)' or 'cuda (NVIDIA H200)': what evaluation results record next to their dtype."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    name = cpu_name() if device.type == "cpu" else ""
    return f"{device.type} ({name})" if name else device.type


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """True when this CPU has bf16 matrix instructions and bf16 matmuls measurably beat fp32.

    Decided once per machine: the first call measures (`bf16_speedup`) and stores the decision in
    `precision_cache_path()` under `machine_key()`; every later call, in any process, reads it, so a run's training
    and its evaluations compute in the same precision however loaded the machine is. Delete the file to re-measure.
    """
    if not set(_BF16_CPU_FLAGS) & cpu_flags():
        return False  # emulated bf16: no need to time it
    key = machine_key()
    path = precision_cache_path()
    if (known := _cached_decision(path, key)) is not None:
        return known
    with _cache_lock(path):
        if (known := _cached_decision(path, key)) is not None:  # another process measured while we waited
            return known
        speedup = bf16_speedup()
        fast = speedup >= BF16_MIN_SPEEDUP
        _store_decision(path, key, {"bf16": fast, "speedup": round(speedup, 3), "torch": torch.__version__})
    return fast


# bf16 autocast is chosen only when its matmuls are clearly faster: 1.3x leaves a margin over probe noise and the
# casts autocast adds; hardware bf16 (AMX) measures 2-10x, emulated bf16 0.02-0.5x, so the margin is rarely close.
BF16_MIN_SPEEDUP = 1.3
CACHE_ENV = "POSENC_PRECISION_CACHE"  # the cache file's path (tests point it into a temporary directory)


def precision_cache_path() -> Path:
    """`$POSENC_PRECISION_CACHE`, else `$XDG_CACHE_HOME/posenc/precision.json`, else `~/.cache/posenc/...`."""
    if env := os.environ.get(CACHE_ENV):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "posenc" / "precision.json"


def machine_key() -> str:
    """What the bf16 decision depends on: the CPU model, its feature flags (hashed) and the torch version."""
    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:16]
    return f"{cpu_name() or platform.machine()} | flags {flags} | torch {torch.__version__}"


def _read_cache(path: Path) -> dict[str, Any]:
    """The cache file's entries; {} when it is missing, unreadable or not a JSON object (it is then re-measured)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _cached_decision(path: Path, key: str) -> bool | None:
    entry = _read_cache(path).get(key)
    if isinstance(entry, dict) and isinstance(entry.get("bf16"), bool):
        return entry["bf16"]
    return None


def _store_decision(path: Path, key: str, entry: dict[str, Any]) -> None:
    """Add `key`'s entry to the cache file atomically; a cache that cannot be written is skipped (the decision
    then holds for this process only)."""
    doc = _read_cache(path)
    doc[key] = entry | {"measured": datetime.now(UTC).isoformat(timespec="seconds")}
    with contextlib.suppress(OSError):
        atomic_write_json(path, doc)


@contextlib.contextmanager
def _cache_lock(path: Path) -> Iterator[None]:
    """One process measures at a time (the others wait, then read its decision); no lock where none can be made."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(path.with_name(path.name + ".lock"), timeout=60)
        lock.acquire()
    except (OSError, Timeout):
        yield
        return
    try:
        yield
    finally:
        lock.release()


def bf16_speedup(size: int = 256, rounds: int = 15, reps: int = 4) -> float:
    """How much faster a `size`² matmul runs in bf16 than in fp32 on one CPU thread (> 1: bf16 is faster).

    Made for a loaded machine: after a warm-up (oneDNN's kernel selection, AMX set-up), `rounds` samples of `reps`
    matmuls per dtype are taken alternately, so a burst of other work hits both dtypes alike. Other processes can
    only make a sample slower, never faster, so each dtype's time is its fastest sample (min-of-k): with 15 samples
    a side, one clean sample each is enough. One thread: a thread that waits for a busy core would time the wait.
    """
    with threads(1):
        pair = {dt: (torch.randn(size, size).to(dt), torch.randn(size, size).to(dt)) for dt in _PROBE_DTYPES}
        for dt in _PROBE_DTYPES:  # warm-up
            _matmul_seconds(*pair[dt], reps)
        best = dict.fromkeys(_PROBE_DTYPES, math.inf)
        for r in range(rounds):
            for dt in _PROBE_DTYPES if r % 2 == 0 else _PROBE_DTYPES[::-1]:
                best[dt] = min(best[dt], _matmul_seconds(*pair[dt], reps))
    return best[torch.float32] / max(best[torch.bfloat16], 1e-12)


_PROBE_DTYPES = (torch.float32, torch.bfloat16)


def _matmul_seconds(a: Tensor, b: Tensor, reps: int) -> float:
    """Wall seconds of `reps` matmuls a @ b (the probe's one timing; tests replace it with a noisy clock)."""
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return time.perf_counter() - start


@contextlib.contextmanager
def threads(n: int) -> Iterator[int]:
    """Temporarily use `n` CPU threads (0: the free cores, `set_threads`)."""
    before = torch.get_num_threads()
    try:
        yield set_threads(n)
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
