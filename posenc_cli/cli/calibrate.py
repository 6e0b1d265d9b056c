"""`posenc calibrate`: fit the attention temperature a run is evaluated with (DroPE's c, NoPE HeadScale) into a new
child run (`extension.calibrate`); `posenc eval-extrapolate CHILD` then applies it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from posenc_cli import api
from posenc_cli.cli.app import app, console, handles_errors, progress_bar

if TYPE_CHECKING:
    from posenc_cli.api.calibration import CalibrateResult

_EPILOG = "\n".join(
    [
        "Examples:",
        "  posenc calibrate outputs/runs/drope --temperature drope --length 4x",
        "  posenc calibrate RUN --temperature drope --length 2x --length 4x --eval",
        "  posenc calibrate outputs/runs/nope --temperature head-scale --length 4x --steps 200",
    ]
)
_DROPE, _HS = "DroPE's c", "HeadScale"


@app.command("calibrate", epilog=_EPILOG)
@handles_errors
def calibrate_command(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="The trained run (never modified).")],
    temperature: Annotated[
        str, typer.Option("--temperature", metavar="drope|head-scale", help="The temperature to fit.")
    ] = "drope",
    length: Annotated[
        list[str] | None,
        typer.Option(
            "--length",
            metavar="4x|N",
            help="Fit length: a multiple of the training length (4x) or tokens; repeat for several (drope).",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", metavar="DIR", help="New run directory (default: <RUN_DIR>-<temperature>x<s>)."),
    ] = None,
    tokens: Annotated[int, typer.Option("--tokens", metavar="N", help="Tokens scored per fit length.")] = 8192,
    split: Annotated[
        str,
        typer.Option(
            "--split", metavar="train|val", help="Fit on the start of this split (evaluations read val only)."
        ),
    ] = "train",
    step: Annotated[float, typer.Option("--step", help="Grid step of c.", rich_help_panel=_DROPE)] = 0.1,
    c_min: Annotated[
        float,
        typer.Option("--c-min", help="Smallest c of the grid (cut where β would reach 0).", rich_help_panel=_DROPE),
    ] = -0.5,
    c_max: Annotated[float, typer.Option("--c-max", help="Largest c of the grid.", rich_help_panel=_DROPE)] = 2.0,
    refine: Annotated[
        int, typer.Option("--refine", metavar="N", help="Golden-section scores after the grid.", rich_help_panel=_DROPE)
    ] = 10,
    form: Annotated[
        str,
        typer.Option(
            "--form",
            metavar="cell|query",
            help="One β per evaluation cell (s = cell length / L, the reference's) or per query (s = (i+1) / L).",
            rich_help_panel=_DROPE,
        ),
    ] = "cell",
    steps: Annotated[int, typer.Option("--steps", metavar="N", help="Training steps.", rich_help_panel=_HS)] = 200,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate.", rich_help_panel=_HS)] = 0.05,
    init: Annotated[float, typer.Option("--init", help="Initial λ of every head.", rich_help_panel=_HS)] = 1.0,
    batch_size: Annotated[
        int, typer.Option("--batch-size", metavar="N", help="Windows per step.", rich_help_panel=_HS)
    ] = 4,
    evaluate: Annotated[
        bool, typer.Option("--eval", help="Run eval-extrapolate (default lengths) on parent and child, side by side.")
    ] = False,
    threads: Annotated[int, typer.Option("--threads", metavar="N", help="CPU threads (0: the free cores).")] = 0,
) -> None:
    """Fit a trained run's attention temperature into a new run directory.

    drope: DroPE's β = 1 + c·ln(s) (s: the evaluation cell's length over the training length; --form query: the
    query's keys over it), c of either sign found by a grid then a golden-section search minimising the loss at the
    fit lengths. head-scale: one learned λ per layer and head
    (NoPE HeadScale), trained at the fit length with the model frozen. The child's config records the temperature,
    its meta.json the parent and the fit; `posenc eval-extrapolate CHILD` applies it. Re-running the same command
    returns the child already there.
    """
    # deferred: keeps this command's modules (and torch, which the API loads) off posenc --help start-up
    from posenc_cli.cli.extend_report import evaluation_table

    bar = progress_bar()
    task = None
    spinner = None

    def progress(done: int, planned: int, loss: float) -> None:
        nonlocal task
        what = "c scored" if temperature == "drope" else "steps"
        if task is None:
            bar.start()
            task = bar.add_task(f"calibrate {temperature}", total=planned)
        bar.update(
            task, completed=done, total=planned, description=f"calibrate {temperature} ({what}) · loss {loss:.4f}"
        )

    def status(message: str) -> None:  # --eval: the fit's bar gives way to a spinner per run
        nonlocal spinner
        bar.stop()
        if spinner is None:
            spinner = console.status(escape(message), spinner="dots")
            spinner.start()
        else:
            spinner.update(escape(message))

    try:
        result = api.calibrate(
            run_dir,
            temperature,
            length or ["4x"],
            out,
            threads=threads,
            progress=progress,
            evaluate=evaluate,
            status=status,
            tokens=tokens,
            split=split,
            step=step,
            c_min=c_min,
            c_max=c_max,
            refine=refine,
            form=form,
            steps=steps,
            lr=lr,
            init=init,
            batch_size=batch_size,
        )
    finally:
        bar.stop()
        if spinner is not None:
            spinner.stop()
    for line in summary_lines(result):
        console.print(line, highlight=False)
    if result.evaluation is not None:  # the same side-by-side table as extend --eval
        console.print(evaluation_table(result.evaluation))


def edge_note(result: CalibrateResult) -> str:
    """What the fitted c means when it is not an interior minimum: an end of the searched range, or c = 0."""
    c, bounds = result.c, result.c_range
    if result.at_edge and bounds:
        side, flag = ("lower", "--c-min") if c is not None and c <= sum(bounds) / 2 else ("upper", "--c-max")
        span = f"[{bounds[0]:g}, {bounds[-1]:g}]"
        return f" (c = {c:g} is the {side} edge of the search {span}: a bound, not a minimum; widen {flag})"
    if c == 0:
        return " (neither sign of c lowers the loss at these lengths: the child evaluates as its parent)"
    return ""


def summary_lines(result: CalibrateResult) -> list[str]:
    """What was written and fitted: the child, the temperature, the loss (and perplexity) at each fit length."""
    L = result.train_length
    head = "already there" if result.status == "already_complete" else "wrote"
    lines = [f"{head} {escape(str(result.out_dir))} (parent {escape(str(result.parent_dir))}, L={L})"]
    if result.c is not None:
        betas = ", ".join(f"β({n / L:g}×)={1 + result.c * math.log(n / L):.4f}" for n in result.lengths)
        form = " per query" if result.form == "query" else ""
        lines.append(f"DroPE c = {result.c:g}{form}: {betas}{edge_note(result)}")
    if result.head_scale is not None:
        for i, scales in enumerate(result.head_scale):
            lines.append(f"layer {i} λ: " + " ".join(f"{x:.3f}" for x in scales))
    for n in result.lengths:
        before, after = result.loss_before.get(n), result.loss_after.get(n)
        if before is not None and after is not None:
            split = result.data.get(str(n), {}).get("split", "?")
            ppl = f"ppl {math.exp(before):.3f} -> {math.exp(after):.3f}"
            lines.append(f"fit loss at {n} tokens ({n / L:g}×, {split} split): {before:.4f} -> {after:.4f} ({ppl})")
    lines.append(f"evaluate it: posenc eval-extrapolate {escape(str(result.out_dir))}")
    return lines
