"""What each run of a sweep cost: fine-tune tokens and seconds, and the evaluation's seconds at the longest length.

Read from disk after the fact: a job's `profile.json` (`posenc_cli.perf.profiling`: wall seconds per phase) and its
run's
`meta.json` (tokens trained). For a derived run (an `extend` job) the training phases (setup, steps, validation,
checkpoints) are its fine-tune, and `extend` is the scaling itself; for a trained run they are its training. A job
without a profile (a run evaluated outside a sweep) has no costs (None), never an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc_cli.perf.profiling import PROFILE_FILE, TRAIN_PHASES, read_profile

__all__ = ["RunCost", "run_cost", "run_costs"]


@dataclass(frozen=True)
class RunCost:
    """One run's costs; None where not recorded. `eval_length` is the longest length evaluated (tokens)."""

    label: str
    train_tokens: int | None
    train_s: float | None
    extend_s: float | None
    eval_length: int | None
    eval_s: float | None


def run_cost(label: str, run_dir: Path) -> RunCost:
    """Costs of the run in `run_dir` from its profile.json and meta.json (see the module docstring)."""
    profile = read_profile(Path(run_dir) / PROFILE_FILE) or {}
    seconds: dict[str, float] = profile.get("seconds") or {}
    trained = [seconds[p] for p in TRAIN_PHASES if p in seconds]
    lengths = {int(k.split("=", 1)[1]): v for k, v in seconds.items() if k.startswith("eval L=")}
    longest = max(lengths) if lengths else None
    return RunCost(
        label=label,
        train_tokens=_trained_tokens(Path(run_dir)) if trained else None,
        train_s=sum(trained) if trained else None,
        extend_s=seconds.get("extend"),
        eval_length=longest,
        eval_s=lengths[longest] if longest is not None else None,
    )


def run_costs(runs: Iterable[tuple[str, Path]]) -> list[RunCost]:
    """`run_cost` of each (label, run directory), in order."""
    return [run_cost(label, path) for label, path in runs]


def _trained_tokens(run_dir: Path) -> int | None:
    try:
        meta: dict[str, Any] = json.loads((run_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    tokens = meta.get("tokens")
    return int(tokens) if isinstance(tokens, int | float) else None
