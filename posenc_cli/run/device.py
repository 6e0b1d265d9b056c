"""Where and in which precision a run computes: device choice, CPU threads, bf16 autocast.

`precision=auto` picks bf16 autocast only where it is actually fast: on CUDA when the GPU supports bf16, and on CPU
when the CPU has bf16 matrix instructions (AMX or AVX512-BF16) *and* a short timed matmul probe confirms that bf16
beats fp32. Without those instructions PyTorch emulates bf16 matmuls, which can be tens of times slower than fp32
(on an AVX2-only AMD EPYC, a 512² bf16 matmul is ~60× slower). Master weights stay fp32 in every case.
"""

from __future__ import annotations

import contextlib
import functools
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import torch

from posenc_cli.errors import ConfigError

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
    """Use `n` intra-op CPU threads (0 keeps torch's default: one per physical core); returns the count in use."""
    if n > 0 and torch.get_num_threads() != n:
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
    """True when this CPU has bf16 matrix instructions and bf16 matmuls measurably beat fp32 (cached per process)."""
    if not set(_BF16_CPU_FLAGS) & cpu_flags():
        return False
    return bf16_speedup() > 1.3


def bf16_speedup(size: int = 256, repeats: int = 5) -> float:
    """Time ratio fp32/bf16 of a `size`² matmul on CPU (> 1 means bf16 is faster)."""
    times = {}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(size, size).to(dtype)
        b = torch.randn(size, size).to(dtype)
        a @ b  # warm-up
        times[dtype] = min(_timed(lambda a=a, b=b: a @ b) for _ in range(repeats))
    return times[torch.float32] / max(times[torch.bfloat16], 1e-9)


def _timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


@contextlib.contextmanager
def threads(n: int) -> Iterator[int]:
    """Temporarily use `n` CPU threads (0 = leave as is)."""
    before = torch.get_num_threads()
    try:
        yield set_threads(n)
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
