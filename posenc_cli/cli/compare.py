"""`posenc compare`: tables and plots from run or sweep directories already on disk (`api.comparison`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from posenc_cli import api
from posenc_cli.cli.app import app, console, handles_errors
from posenc_cli.errors import UserError
from posenc_cli.report.gate import DEFAULT_COMPETENCE

if TYPE_CHECKING:
    import pandas as pd

    from posenc_cli.api import Comparison, TextTable

_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}
FORMATS = ("table", "csv", "json", "markdown")


def print_comparison(comparison: Comparison, fmt: str = "table", *, to: Console = console) -> None:
    """The comparison in `fmt` (table, csv, json, markdown) on `to`, then a line per file written for it."""
    if fmt == "json":
        to.print_json(json.dumps(comparison.to_json()))
    elif fmt == "csv":
        to.print(comparison.to_csv(), end="", markup=False, highlight=False)
    elif fmt == "markdown":
        to.print(comparison.to_markdown(), markup=False, highlight=False)
    else:
        # deferred: keeps this command's modules off posenc --help start-up
        from posenc_cli.report.tables import render_table

        columns, rows, title = comparison.table
        caption = "\n".join(comparison.caption)
        if rows:
            to.print(render_table(columns, rows, title=title, caption=caption, legend=comparison.legend))
        else:  # e.g. runs trained on answer tokens only: no perplexity table, only why
            to.print(caption, highlight=False, markup=False)
    for path in comparison.written:
        to.print(f"wrote {path}", highlight=False)


def text_table(view: TextTable) -> Table:
    """A table of ready text: the first two columns left-aligned (labels), the numbers right-aligned."""
    out = Table(title=view.title, caption=view.caption, title_justify="left", caption_justify="left")
    for i, h in enumerate(view.headers):
        out.add_column(h, justify="left" if i < 2 else "right")
    for row in view.rows:
        out.add_row(*row)
    return out


def frame_table(frame: pd.DataFrame, *, title: str | None = None, caption: str | None = None) -> Table:
    """Any DataFrame as a rich table: one column per frame column (text left, numbers right; floats to 3 decimals,
    NaN as "–"), the index as the first column when it is named."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.report.tables import fit_to_content

    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left", header_style="bold")
    named_index = frame.index.name is not None
    if named_index:
        table.add_column(str(frame.index.name), no_wrap=True)
    numeric = {c: frame[c].dtype.kind in "iuf" for c in frame.columns}
    for c in frame.columns:
        table.add_column(str(c), justify="right" if numeric[c] else "left", no_wrap=True)
    for index, row in frame.iterrows():
        cells = [_frame_cell(v) for v in row.tolist()]
        table.add_row(*([str(index)] if named_index else []), *cells)
    return fit_to_content(table)  # headers whole, whatever the terminal's width


def _frame_cell(value: Any) -> str:
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.3f}"
    return str(value)


def mrr_caption(frame: pd.DataFrame) -> str:
    """Under the MRR table: what was ranked, which runs the competence gate left out (per task), and where the
    paper's numbers come from."""
    pool = frame.attrs.get("pool", "paper")
    schemes = ", ".join(map(str, frame.attrs.get("schemes", [])))
    lines = [
        f"Mean reciprocal rank of the beyond-L accuracy (L+1..2L) over {frame.attrs.get('queries', '?')} queries "
        f"(task × seed), ranked among {schemes} (pool {pool}); ties to the first alphabetically, "
        "mrr_ties_averaged averages tied ranks; paper: Kazemnejad et al. 2023 (arXiv 2305.19466), figure 1."
    ]
    per_task = frame.attrs.get("per_task") or {}
    threshold = frame.attrs.get("competence")
    if frame.attrs.get("include_unlearned"):
        lines.append("Every run ranked (--include-unlearned), whether or not it learned the task in distribution.")
    elif per_task and threshold is not None:
        counts = "; ".join(f"{task} {kept} included, {out} excluded" for task, (kept, out) in per_task.items())
        lines.append(
            f"Ranked: only runs that learned each task (exact match over the training lengths >= {threshold:.0%}, "
            f"--competence; not_learned counts the rest, --include-unlearned ranks them): {counts}."
        )
        lines += [
            f"excluded: {scheme} seed {seed} {task}: "
            + (f"{accuracy:.0%} in distribution, " if accuracy is not None else "")
            + state
            for scheme, seed, task, accuracy, state in frame.attrs.get("excluded", [])
        ]
    return "\n".join(lines)


@app.command("compare", context_settings=_EXTRA)
@handles_errors
def compare_command(
    paths: Annotated[list[Path], typer.Argument(help="Run or sweep directories.")],
    metric: Annotated[
        str,
        typer.Option(
            "--metric",
            help="ppl, bpb, nll or longppl (LongPPL: perplexity over the key tokens one evaluator chose; n/a at or "
            "below the training length, n/m for cells stored without it; the evaluator and the key tokens of each "
            "cell are listed under the table, and there is no ratio column).",
        ),
    ] = "ppl",
    longppl_evaluator: Annotated[
        str | None,
        typer.Option(
            "--longppl-evaluator",
            metavar="RUN",
            help="--metric longppl: show the cells scored on this run's key tokens (default: the one evaluator "
            "the stored cells agree on).",
        ),
    ] = None,
    baseline: Annotated[str | None, typer.Option("--baseline", help="Label or run dir to divide by.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, csv, json or markdown.")] = "table",
    out: Annotated[Path | None, typer.Option("--out", help="Also write results.csv/json and plots here.")] = None,
    all_lengths: Annotated[
        bool,
        typer.Option(
            "--all-lengths",
            help="Runs below a sweep: also show lengths evaluated later, outside the sweep (default: the sweep's).",
        ),
    ] = False,
    reference: Annotated[
        str | None,
        typer.Option(
            "--reference",
            help="Also print posenc's numbers next to a paper's: alibi-table2 (ppl ratios), nope-mrr (the NoPE "
            "paper's mean reciprocal rank over the algorithmic tasks of the runs, from eval-algorithmic).",
        ),
    ] = None,
    competence: Annotated[
        float,
        typer.Option(
            "--competence",
            help="Competence gate: a run whose in-distribution accuracy on a task is below this is 'not learned' in "
            "the task tables and results.csv, and left out of the nope-mrr ranking.",
        ),
    ] = DEFAULT_COMPETENCE,
    include_unlearned: Annotated[
        bool,
        typer.Option("--include-unlearned", help="nope-mrr: rank every run, also those that did not learn the task."),
    ] = False,
    seed_mean: Annotated[
        bool,
        typer.Option(
            "--seed-mean",
            help="Task tables over seeds: one row per experiment (runs of one label whose saved configs differ only "
            "in train.seed), the mean ± sd of each length's score, the seeds' mean ≤L and how many passed the "
            "competence gate (table, markdown and csv; results.csv of --out keeps one row per run).",
        ),
    ] = False,
    costs: Annotated[
        bool,
        typer.Option(
            "--costs",
            help="Also print each run's cost from its sweep job's profile.json: tokens and seconds trained (a "
            "derived run's fine-tune), seconds of the scaling, evaluation seconds at the longest length.",
        ),
    ] = False,
) -> None:
    """Comparison table (and plots with --out) from run or sweep directories already on disk.

    One row per run and way of measuring: another corpus, precision, protocol or positions mode is another row.

    n=K rows average seeds (configs equal but for train.seed); other runs of one name show their directory.

    Task tables: a row per seed; --seed-mean: a row per experiment, mean ± sd over its seeds, seeds learned.

    Example: [bold]posenc compare outputs/sweeps/*-extrapolation --metric bpb --format markdown[/]
    """
    stray = [str(p) for p in paths if str(p).startswith("-")]  # unknown options arrive as paths (_EXTRA)
    if stray:
        raise UserError(f"unknown option {stray[0]} (see posenc compare --help)")
    if fmt not in FORMATS:
        raise UserError(f"--format must be table, csv, json or markdown, got {fmt}")
    report = api.comparison(
        paths,
        metric=metric,
        baseline=baseline,
        all_lengths=all_lengths,
        out=out,
        reference=reference,
        costs=costs,
        competence=competence,
        include_unlearned=include_unlearned,
        longppl_evaluator=longppl_evaluator,
        seed_mean=seed_mean,
    )
    print_comparison(report.comparison, fmt)
    if fmt == "table":
        # deferred: keeps this command's modules off posenc --help start-up
        from posenc_cli.cli.tasks import print_task_summary
        from posenc_cli.report.task_seed_report import seed_tables

        if report.task_seeds is not None:
            for table in seed_tables(report.task_seeds.to_dict("records"), competence):
                console.print(table)
        else:
            print_task_summary(report.comparison.records, console, competence=competence)
        if report.curves is not None:
            console.print(text_table(report.curves))
    if report.reference is not None:
        console.print(text_table(report.reference))
    if report.mrr is not None:
        title = "Mean reciprocal rank over the algorithmic tasks: posenc / paper (nope-mrr)"
        console.print(frame_table(report.mrr, title=title, caption=mrr_caption(report.mrr)))
    if report.costs is not None:
        # deferred: keeps this command's modules off posenc --help start-up
        import dataclasses

        from posenc_cli.report.tables import cost_table

        console.print(cost_table([dataclasses.asdict(c) for c in report.costs]))
