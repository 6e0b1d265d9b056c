"""Device, precision and thread selection."""

from __future__ import annotations

import pytest
import torch

import posenc_cli.run.device as device
from posenc_cli.errors import ConfigError


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


def test_fast_bf16_needs_the_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    device.cpu_has_fast_bf16.cache_clear()
    monkeypatch.setattr(device, "cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setattr(device, "bf16_speedup", lambda: pytest.fail("no probe without bf16 instructions"))
    assert device.cpu_has_fast_bf16() is False
    device.cpu_has_fast_bf16.cache_clear()
    monkeypatch.setattr(device, "cpu_flags", lambda: {"avx512_bf16"})
    monkeypatch.setattr(device, "bf16_speedup", lambda: 0.5)  # flags present but the probe says slower
    assert device.cpu_has_fast_bf16() is False
    device.cpu_has_fast_bf16.cache_clear()
    monkeypatch.setattr(device, "bf16_speedup", lambda: 3.0)
    assert device.cpu_has_fast_bf16() is True
    device.cpu_has_fast_bf16.cache_clear()


def test_bf16_speedup_probe_returns_a_ratio() -> None:
    assert device.bf16_speedup(size=32, repeats=1) > 0


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
    with device.threads(0) as n:  # 0 keeps torch's default
        assert n == before


def test_cpu_flags_is_a_set() -> None:
    assert isinstance(device.cpu_flags(), set)
