"""The ranges a number given to posenc may take, declared once: the CLI's options (`api/option_ranges.py`), the config
dataclasses' `validate()` methods, the Python API and sweeps all check against these, before anything is
allocated or loaded. Each limit is a size no run of posenc's scale reaches (its largest documented run trains at
2,048 tokens and evaluates at 64×), so a value beyond it is a typo or an attack, refused in one line.

Fixed limits are what tests hold. Work that scales with the input (tokens × batch, lengths × examples) is also
checked against the machine's free memory when the work is planned (`check_memory`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from posenc_cli.errors import ConfigError

MAX_TOKENS = 1 << 22  # 4,194,304 tokens: a sequence length, a window or a token budget
MAX_STEPS = 10_000_000  # optimiser steps
MAX_BATCH = 1 << 16  # sequences per batch
MAX_COUNT = 1_000_000  # trials, examples, rounds, grid points
MAX_SEED = 2**63 - 1  # torch's seed range (config.MAX_SEED: train.seed's)
MAX_THREADS = 4096
MAX_FACTOR = 1e6  # scaling factors, RoPE bases over the default, β of YaRN
MAX_LR = 10.0
MAX_SECONDS = 7 * 24 * 3600.0  # a time budget: one week
MAX_GIB = 1 << 20  # a memory budget, in GiB


@dataclass(frozen=True)
class Bound:
    """`low <= value <= high`, finite, and a whole number if `integer`."""

    low: float
    high: float
    integer: bool = False
    what: str = ""  # the kind of number, named in the message: 'must be an accuracy in [0, 1]'

    def problem(self, value: object) -> str | None:
        """What is wrong with `value` ('must be in [1, 4194304], got 0'), or None (a bool is not a number)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, got {_short(value)}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number, got {value}"
        if self.integer and isinstance(value, float) and not value.is_integer():
            return f"must be a whole number, got {value}"
        if not self.low <= value <= self.high:
            kind = f"{self.what} " if self.what else ""
            return f"must be {kind}in [{_num(self.low)}, {_num(self.high)}], got {_short(value)}"
        return None

    def check(self, value: object, name: str) -> None:
        """`ConfigError` naming `name` unless `value` is a finite number in range."""
        problem = self.problem(value)
        if problem is not None:
            raise ConfigError(f"{name} {problem}")


def _num(x: float) -> str:
    """4194304 as '4194304', 1e-06 as '1e-06'."""
    if isinstance(x, int):
        return str(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e16 else f"{x:g}"


def _short(value: object) -> str:
    """A value as at most 40 characters: a 5,000-digit integer must not become a 5,000-character line."""
    if isinstance(value, int) and abs(value) >= 10**30:
        return f"a {len(str(abs(value)))}-digit integer"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check(value: object, name: str, low: float, high: float, *, integer: bool = False) -> None:
    """`Bound(low, high, integer).check(value, name)`."""
    Bound(low, high, integer).check(value, name)


def available_memory() -> int | None:
    """Bytes the kernel says a new allocation can take (MemAvailable, capped by RLIMIT_AS where one is set);
    None where neither can be read."""
    limits: list[int] = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
                    break
    except OSError:
        pass
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            limits.append(soft)
    except (ImportError, OSError, ValueError):
        pass
    return min(limits) if limits else None


def check_memory(nbytes: float, what: str) -> None:
    """`ConfigError` when `what` needs more than the memory this machine has free now (one line, both numbers)."""
    free = available_memory()
    if free is not None and nbytes > free:
        need, have = nbytes / 2**30, free / 2**30
        raise ConfigError(f"{what} needs about {need:.1f} GiB; {have:.1f} GiB is free on this machine")


def workload_bytes(tokens: float, d_model: int, n_layer: int, vocab: int) -> float:
    """Memory of one forward over `tokens` tokens at 4 bytes a value: the logits (and their softmax) plus about
    sixteen activations of width d_model per layer. A lower bound: enough to refuse what cannot fit."""
    return 4.0 * tokens * (2 * vocab + 16 * d_model * max(n_layer, 1))
