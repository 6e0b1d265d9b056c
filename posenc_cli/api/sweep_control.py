"""What a caller of `run_planned_sweep` needs around it: the ways a sweep stops short (`SweepInterrupted`: a job was
interrupted; `SelectionPending`: a select stage could not pick yet; `Stopped`: SIGTERM inside `interrupts_raise`),
the check of a competence threshold before anything is planned, the seconds this process had lived before the sweep
(its profile's start-up), and each select stage's pick as lines."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from posenc_cli.errors import Stopped, sigterm_raises
from posenc_cli.evaluation.competence import check_threshold
from posenc_cli.perf.profiling import process_age_s
from posenc_cli.sweep.runner import SweepInterrupted
from posenc_cli.sweep.select import SelectionPending, pick_summary

__all__ = [
    "SelectionPending",
    "Stopped",
    "SweepInterrupted",
    "check_competence",
    "interrupts_raise",
    "pick_lines",
    "startup_seconds",
]


def check_competence(threshold: float) -> None:
    """A one-line `ConfigError` unless `threshold` (`--competence`) is an accuracy in [0, 1]."""
    check_threshold(threshold)


@contextmanager
def interrupts_raise() -> Iterator[None]:
    """Within the block SIGTERM raises `Stopped` (as Ctrl-C raises `KeyboardInterrupt`), also between a sweep's
    jobs; the previous handler comes back after (`errors.sigterm_raises`)."""
    with sigterm_raises():
        yield


def startup_seconds() -> float | None:
    """Seconds since this process started (interpreter start-up and imports), None where it cannot be read."""
    return process_age_s()


def pick_lines(pick: dict[str, Any]) -> list[str]:
    """One line per group of a select stage's recorded pick (`SweepReport.picks[stage]`): 'pos=rope: train.lr=0.003
    (val_loss 1.2345, best of 6)'."""
    return pick_summary(pick)
