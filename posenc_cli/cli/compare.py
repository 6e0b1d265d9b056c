"""`posenc compare`: tables and plots from run or sweep directories already on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from posenc_cli.cli.app import app, console, handles_errors
from posenc_cli.errors import UserError

_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}


def _print_reference(table: Any, records: list[Any]) -> None:
    """posenc's ppl(m·L)/ppl(L) next to the paper's, one row per run label (`reference_tables.side_by_side`)."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.analysis.compare import to_results
    from posenc_cli.report.reference_tables import length_notes, side_by_side

    results = to_results(records)
    headers, rows = side_by_side(table, results)
    caption = "\n".join([table.citation, *length_notes(table, results)])
    out = Table(
        title=f"ppl(L') / ppl(L): posenc / paper ({table.name})",
        caption=caption,
        title_justify="left",
        caption_justify="left",
    )
    for i, h in enumerate(headers):
        out.add_column(h, justify="left" if i < 2 else "right")
    for row in rows:
        out.add_row(*row)
    console.print(out)


@app.command("compare", context_settings=_EXTRA)
@handles_errors
def compare_command(
    paths: Annotated[list[Path], typer.Argument(help="Run or sweep directories.")],
    metric: Annotated[str, typer.Option("--metric", help="ppl, bpb or nll.")] = "ppl",
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
        typer.Option("--reference", help="Also print posenc's ratios next to a paper's table: alibi-table2."),
    ] = None,
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

    Example: [bold]posenc compare outputs/sweeps/*-extrapolation --metric bpb --format markdown[/]
    """
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.analysis.compare import gather, render
    from posenc_cli.report.reference_tables import reference_table

    stray = [str(p) for p in paths if str(p).startswith("-")]  # unknown options arrive as paths (_EXTRA)
    if stray:
        raise UserError(f"unknown option {stray[0]} (see posenc compare --help)")
    if metric not in ("ppl", "bpb", "nll"):
        raise UserError(f"--metric must be ppl, bpb or nll, got {metric}")
    if fmt not in ("table", "csv", "json", "markdown"):
        raise UserError(f"--format must be table, csv, json or markdown, got {fmt}")
    if out is not None:
        # deferred: keeps this command's modules off posenc --help start-up
        from posenc_cli.report.output_files import check_writable_dir

        check_writable_dir(out)  # before any table is printed
    records = gather(paths, all_lengths=all_lengths)
    table = reference_table(reference) if reference is not None else None  # an unknown name fails before output
    render(records, metric=metric, baseline=baseline, fmt=fmt, out=out, console=console)
    if fmt == "table":
        # deferred: keeps this command's modules off posenc --help start-up
        from posenc_cli.cli.tasks import print_task_summary

        print_task_summary(records, console)
    if table is not None:
        _print_reference(table, records)
    if costs:
        # deferred: keeps this command's modules off posenc --help start-up
        import dataclasses

        from posenc_cli.perf.costs import run_costs
        from posenc_cli.report.tables import cost_table

        rows = run_costs((r.label, r.run_dir) for r in records)
        console.print(cost_table([dataclasses.asdict(c) for c in rows]))
