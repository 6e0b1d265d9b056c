"""`posenc sweep` (config-driven multiruns) and `posenc compare` (tables and plots from directories on disk)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from posenc_cli.cli.app import ConfigDirOption, app, console, handles_errors, split_args
from posenc_cli.errors import UserError

_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command("sweep", context_settings=_EXTRA)
@handles_errors
def sweep_command(
    args: Annotated[list[str] | None, typer.Argument(help="[NAME] [OVERRIDES...]; NAME defaults to extrapolation.")] = (
        None
    ),
    out: Annotated[Path | None, typer.Option("--out", help="Sweep directory (re-use it to resume).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Validate and list the jobs; run nothing.")] = False,
    viz: Annotated[
        bool, typer.Option("--viz", help="Also draw attention-by-distance panels of every run (attention.png).")
    ] = False,
    config_dir: ConfigDirOption = None,
) -> None:
    """Run a sweep file from configs/sweep/ through Hydra's multirun, then print the comparison table.

    Example: [bold]posenc sweep extrapolation train.steps=200 pos=rope,alibi[/]. Parallel:
    [bold]hydra/launcher=joblib hydra.launcher.n_jobs=2[/]; Slurm: [bold]hydra/launcher=submitit_slurm[/].
    """
    from posenc_cli.compare import comparison_outputs, gather
    from posenc_cli.hydra_bridge import config_dir as packaged_config_dir
    from posenc_cli.sweep import find_sweep_file, load_sweep_spec, plan_sweep, run_sweep, validate_plan

    names, overrides = split_args(args)
    if len(names) > 1:
        raise UserError(f"one sweep name expected, got {', '.join(names)} (overrides need '=')")
    name = names[0] if names else "extrapolation"
    user_dir = Path(config_dir) if config_dir else None
    launcher = [o for o in overrides if o.lstrip("+~").startswith("hydra")]
    task = [o for o in overrides if o not in launcher]
    roots = [p for p in (user_dir, packaged_config_dir()) if p is not None]
    spec = load_sweep_spec(find_sweep_file(name, roots))
    if dry_run:
        plans = plan_sweep(spec, task)
        validate_plan(plans, user_dir)
        _print_plan(spec.name, plans, out)
        return
    sweep_dir = out or Path("outputs") / "sweeps" / f"{time.strftime('%Y%m%d-%H%M%S')}-{spec.name}"
    console.print(f"[bold]sweep[/] {spec.name} → {sweep_dir}", highlight=False)
    start = time.perf_counter()
    run_sweep(
        spec,
        task,
        sweep_dir,
        launcher_overrides=launcher,
        user_config_dir=user_dir,
        on_event=lambda kind, text: console.print(f"[cyan]{kind}[/] {text}", highlight=False),
    )
    console.print(f"sweep finished in {time.perf_counter() - start:.0f} s", highlight=False)
    records = gather([sweep_dir])
    failed = comparison_outputs(records, sweep_dir, console=console)
    if viz:
        from posenc_cli.viz import write_attention_comparison

        done = [r.run_dir for r in records if r.status == "ok"]
        if done:
            console.print(f"wrote {write_attention_comparison(done, Path(sweep_dir) / 'attention.png')}")
    if failed:
        raise typer.Exit(1)


def _print_plan(name: str, plans: list, out: Path | None) -> None:
    total = sum(len(p.jobs) for p in plans)
    console.print(f"[bold]{name}[/]: {total} job(s) in {len(plans)} stage(s); dry run, nothing was started")
    for plan in plans:
        table = Table(title=f"stage {plan.stage.name} ({plan.stage.action})", title_justify="left")
        table.add_column("job")
        table.add_column("label")
        table.add_column("parent")
        table.add_column("overrides")
        for job in plan.jobs:
            table.add_row(job.name, job.label, job.parent or "", " ".join(job.overrides))
        if not plan.jobs:
            table.add_row("(none)", "", plan.stage.parent or "", "no parent run matches")
        console.print(table)


def _print_reference(table: Any, records: list[Any]) -> None:
    """posenc's ppl(m·L)/ppl(L) next to the paper's, one row per run label (`reference_tables.side_by_side`)."""
    from posenc_cli.compare import to_results
    from posenc_cli.reference_tables import side_by_side

    headers, rows = side_by_side(table, to_results(records))
    out = Table(title=f"ppl(L') / ppl(L): posenc / paper ({table.name})", caption=table.citation, title_justify="left")
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
) -> None:
    """Comparison table (and plots with --out) from run or sweep directories already on disk.

    Example: [bold]posenc compare outputs/sweeps/*-extrapolation --metric bpb --format markdown[/]
    """
    from posenc_cli.compare import gather, render
    from posenc_cli.reference_tables import reference_table

    stray = [str(p) for p in paths if str(p).startswith("-")]  # unknown options arrive as paths (_EXTRA)
    if stray:
        raise UserError(f"unknown option {stray[0]} (see posenc compare --help)")
    if metric not in ("ppl", "bpb", "nll"):
        raise UserError(f"--metric must be ppl, bpb or nll, got {metric}")
    if fmt not in ("table", "csv", "json", "markdown"):
        raise UserError(f"--format must be table, csv, json or markdown, got {fmt}")
    records = gather(paths, all_lengths=all_lengths)
    table = reference_table(reference) if reference is not None else None  # an unknown name fails before output
    render(records, metric=metric, baseline=baseline, fmt=fmt, out=out, console=console)
    if table is not None:
        _print_reference(table, records)
