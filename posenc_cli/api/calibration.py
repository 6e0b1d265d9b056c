"""`posenc calibrate` as a function: fit a trained run's evaluation temperature (DroPE's c, NoPE HeadScale) into a
new child run (`extension.calibrate`), and with `evaluate=True` measure parent and child side by side."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc_cli.api.extension import evaluate_pair
from posenc_cli.extension.calibrate_settings import CalibrateSettings, check_calibrate

if TYPE_CHECKING:
    from posenc_cli.extension.calibrate import CalibrateResult

__all__ = ["calibrate"]


def calibrate(
    run: str | Path,
    temperature: str = "drope",
    lengths: Sequence[str | int] = ("4x",),
    out: str | Path | None = None,
    *,
    threads: int = 0,
    progress: Callable[[int, int, float], None] | None = None,
    evaluate: bool = False,
    status: Callable[[str], None] | None = None,
    **settings: Any,
) -> CalibrateResult:
    """Fit `temperature` (drope or head-scale) of run `run` at `lengths` ('4x': a multiple of its training length,
    or tokens) and write the child (default `<run>-<temperature>x<s>` beside it), as `posenc calibrate` does.
    `settings`: `extension.calibrate_settings.CalibrateSettings`' other fields (tokens, split, step, c_min, c_max,
    refine, form, steps, lr, init, batch_size), the command's defaults otherwise. `progress(done, planned, loss)`
    follows the fit. `evaluate=True` (`calibrate --eval`): perplexity by length of parent and child at
    eval-extrapolate's default lengths in `result.evaluation` (`api.extension.evaluate_pair`; `status(message)`
    before each run). Idempotent: the same fit of the same parent weights returns the child already there. What the
    flags and the parent's files can decide is refused before torch is imported (`check_calibrate`)."""
    cal = CalibrateSettings(temperature=temperature, lengths=tuple(lengths), **settings)  # type: ignore[arg-type]
    check_calibrate(run, cal, out)
    # deferred: torch, once the refusals that need none are made
    from posenc_cli.extension.calibrate import calibrate_run

    result = calibrate_run(run, cal, out, threads=threads, progress=progress)
    if evaluate:
        result.evaluation = evaluate_pair(result.parent_dir, result.out_dir, threads, status)
    return result
