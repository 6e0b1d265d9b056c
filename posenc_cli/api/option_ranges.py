"""The range of every numeric option of every command, in one table (`OPTION_BOUNDS`): flag metadata the CLI reads
through the API (`option_problem`, called by `cli/app.py`'s `_FlagOption.process_value` while the command line is
parsed), so a value out of range is one line and exit code 2 before anything is loaded or allocated.

An option is found by its flag: the same flag means the same kind of number in every command (`--tokens` is a token
budget, `--seed` a seed); `COMMAND_BOUNDS` holds the few that differ by command. A numeric option missing from both
is still refused when NaN or infinite, and `tests/cli/test_fuzz_cli.py` fails until it is given a row here.
The limits themselves live in `posenc_cli.bounds`, which the config dataclasses and the API check too.
"""

from __future__ import annotations

import math

from posenc_cli.bounds import (
    MAX_BATCH,
    MAX_COUNT,
    MAX_FACTOR,
    MAX_GIB,
    MAX_LR,
    MAX_SECONDS,
    MAX_SEED,
    MAX_STEPS,
    MAX_THREADS,
    MAX_TOKENS,
    Bound,
)

_TOKENS = Bound(1, MAX_TOKENS, integer=True)  # a length, a window or a token budget
_TOKENS0 = Bound(0, MAX_TOKENS, integer=True)
_SEED = Bound(0, MAX_SEED, integer=True)
_COUNT = Bound(1, MAX_COUNT, integer=True)
_ACCURACY = Bound(0.0, 1.0, what="an accuracy")  # competence gates
_FACTOR = Bound(0.0, MAX_FACTOR)
_LR = Bound(0.0, MAX_LR)

OPTION_BOUNDS: dict[str, Bound] = {
    # sizes in tokens
    "--tokens": _TOKENS,
    "--batch-tokens": _TOKENS,
    "--stride": _TOKENS,
    "--target": _TOKENS,
    "--window": _TOKENS,
    "--sinks": _TOKENS0,
    "--train-length": _TOKENS,
    "--original-length": _TOKENS,
    "--finetune-seq-len": _TOKENS,
    "--search-tokens": _TOKENS,
    "--max-length": _TOKENS,
    "--tokens-to-generate": _TOKENS,
    "--group": _TOKENS,
    # counts
    "--trials": _COUNT,
    "--examples": _COUNT,
    "--digits": Bound(1, 1024, integer=True),
    "--refine": Bound(0, 1000, integer=True),
    "--search-budget": Bound(0, 100_000, integer=True),
    "--pose-chunks": Bound(1, 4096, integer=True),
    "--rounds": Bound(1, 10_000, integer=True),
    # training
    "--steps": Bound(1, MAX_STEPS, integer=True),
    "--finetune-steps": Bound(0, MAX_STEPS, integer=True),
    "--finetune-warmup": Bound(0, MAX_STEPS, integer=True),
    "--batch-size": Bound(1, MAX_BATCH, integer=True),
    "--lr": _LR,
    "--finetune-lr": _LR,
    "--init": Bound(0.0, 1e3),
    # seeds and threads
    "--seed": _SEED,
    "--positions-seed": _SEED,
    "--search-seed": _SEED,
    "--threads": Bound(0, MAX_THREADS, integer=True),
    # fractions
    "--competence": _ACCURACY,
    "--threshold": Bound(0.0, 1.0, what="a score"),
    # scaling factors and temperatures
    "--factor": Bound(0.0, math.inf),  # finite; its upper end depends on the run (s·L < 2^31: extension/limits.py)
    "--beta-fast": _FACTOR,
    "--beta-slow": _FACTOR,
    "--attention-factor": _FACTOR,
    "--mscale": _FACTOR,
    "--mscale-all-dim": _FACTOR,
    "--short-factor": _FACTOR,
    "--long-factor": _FACTOR,
    "--low-freq-factor": _FACTOR,
    "--high-freq-factor": _FACTOR,
    "--leaky": _FACTOR,
    "--step": Bound(1e-6, 100.0),  # calibrate: the grid step of DroPE's c
    "--c-min": Bound(-100.0, 100.0),
    "--c-max": Bound(-100.0, 100.0),
    # time and memory budgets
    "--round-seconds": Bound(0.0, 3600.0),
    "--time-budget": Bound(0.0, MAX_SECONDS),
    "--memory-limit": Bound(0.0, MAX_GIB),
}

# (command, flag) pairs whose number is of another kind than the flag's row above.
COMMAND_BOUNDS: dict[tuple[str, str], Bound] = {
    ("eval-tasks", "--tokens-to-generate"): Bound(1, 1 << 16, integer=True),  # tasks.retrieval.MAX_GENERATE
}


_ANY = Bound(-math.inf, math.inf)  # a numeric option without a declared range: finite


def option_bound(command: str | None, flag: str) -> Bound | None:
    """The range of `flag` in `command`, or None where none is declared."""
    return COMMAND_BOUNDS.get((command or "", flag), OPTION_BOUNDS.get(flag))


def option_problem(command: str | None, flag: str, value: float) -> str | None:
    """What is wrong with `value` given to `flag` of `command` ('must be in [1, 4194304], got 0'), or None; a flag
    without a declared range still takes only finite numbers."""
    return (option_bound(command, flag) or _ANY).problem(value)
