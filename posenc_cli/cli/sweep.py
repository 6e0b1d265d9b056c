"""`posenc sweep`: config-driven multiruns (`posenc compare` is in cli/compare.py)."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from posenc_cli.cli.app import ConfigDirOption, app, console, err_console, handles_errors, split_args
from posenc_cli.errors import UserError

_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}
LOCAL_LAUNCHERS = ("basic", "joblib", "submitit_local")  # jobs run on this machine, so its load matters


def shipped_sweeps_help() -> str:
    """'Shipped sweeps (configs/sweep/): extrapolation: ..., seeds: ...' for `posenc sweep --help`."""
    # deferred: keeps this command's modules off posenc --help start-up
    import yaml

    from posenc_cli.config import config_dir

    lines = []
    for path in sorted((config_dir() / "sweep").glob("*.yaml")):
        try:
            description = (yaml.safe_load(path.read_text()) or {}).get("description", "")
        except (OSError, yaml.YAMLError):
            description = ""
        lines.append(f"  [bold]{path.stem}[/]" + (f": {description}" if description else ""))
    return "Shipped sweeps (configs/sweep/; add your own with --config-dir):\n\n" + "\n".join(lines)


@app.command("sweep", context_settings=_EXTRA, epilog=shipped_sweeps_help())
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
    profile: Annotated[
        bool,
        typer.Option(
            "--profile", help="Measure the matmul peak and print where the time went (profile.json is always written)."
        ),
    ] = False,
) -> None:
    """Run a sweep file from configs/sweep/ through Hydra's multirun, then print the comparison table.

    Example: [bold]posenc sweep extrapolation train.steps=200 pos=rope,alibi[/]. Parallel:
    [bold]hydra/launcher=joblib hydra.launcher.n_jobs=2[/]; Slurm: [bold]hydra/launcher=submitit_slurm[/].
    """
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.analysis.compare import comparison_outputs, gather
    from posenc_cli.cli.profile import print_profile
    from posenc_cli.cli.tasks import print_task_summary
    from posenc_cli.config import config_dir as packaged_config_dir
    from posenc_cli.perf.profiling import StageClock, process_age_s, write_sweep_profile
    from posenc_cli.run.interrupts import Stopped, sigterm_raises
    from posenc_cli.sweep.hydra_bridge import launcher_settings
    from posenc_cli.sweep.plan import check_planned, plan_identities, plan_sweep, validate_plan
    from posenc_cli.sweep.runner import SweepInterrupted, run_sweep
    from posenc_cli.sweep.spec import find_sweep_file, load_sweep_spec

    startup_s = process_age_s()  # interpreter start-up and the CLI's imports, before any work
    names, overrides = split_args(args)
    if len(names) > 1:
        raise UserError(f"one sweep name expected, got {', '.join(names)} (overrides need '=')")
    name = names[0] if names else "extrapolation"
    user_dir = Path(config_dir) if config_dir else None
    launcher = [o for o in overrides if o.lstrip("+~").startswith("hydra")]
    task = [o for o in overrides if o not in launcher]
    roots = [p for p in (user_dir, packaged_config_dir()) if p is not None]
    spec = load_sweep_spec(find_sweep_file(name, roots))
    launcher_name, launcher_given = launcher_settings(launcher, user_dir)  # as the launch itself would check
    if dry_run:
        plans = plan_sweep(spec, task)
        configs = validate_plan(plans, user_dir)
        if out is not None and out.is_dir():  # a job there planned with another config is refused, as the run would
            check_planned(out.resolve(), plans, plan_identities(plans, configs))
        _print_plan(spec.name, plans, out, launcher_name, launcher_given)
        return
    if launcher_name in LOCAL_LAUNCHERS:
        _warn_if_busy(plan_sweep(spec, task), launcher_given, user_dir)
    sweep_dir = out or Path("outputs") / "sweeps" / f"{time.strftime('%Y%m%d-%H%M%S')}-{spec.name}"
    console.print(f"[bold]sweep[/] {spec.name} → {sweep_dir}", highlight=False)
    start = time.perf_counter()
    clock = StageClock(lambda kind, text: console.print(f"[cyan]{kind}[/] {text}", highlight=False))
    again = ["posenc", "sweep", name, *overrides, "--out", str(sweep_dir)]
    again += ["--config-dir", str(config_dir)] if config_dir else []
    try:
        with sigterm_raises():  # between jobs too (jobs in this process handle their own)
            plans = run_sweep(
                spec, task, sweep_dir, launcher_overrides=launcher, user_config_dir=user_dir, on_event=clock
            )
    except SweepInterrupted as e:
        err_console.print(f"sweep {e}. Resume with: {shlex.join(again)}", markup=False)
        raise typer.Exit(128 + (e.signum or 2)) from None
    except Stopped as e:
        err_console.print(f"sweep interrupted by SIGTERM. Resume with: {shlex.join(again)}", markup=False)
        raise typer.Exit(128 + e.signum) from None
    clock.finish()
    console.print(f"sweep finished in {time.perf_counter() - start:.0f} s", highlight=False)
    report_start = time.perf_counter()
    records = gather([sweep_dir])
    failed = comparison_outputs(records, sweep_dir, console=console)
    print_task_summary(records, console)  # retrieval scores, for sweeps that measured them (data=tasks)
    if viz:
        # deferred: keeps matplotlib and this command's modules off posenc --help start-up
        from posenc_cli.analysis.viz import write_attention_comparison

        done = [r.run_dir for r in records if r.status == "ok"]
        if done:
            console.print(f"wrote {write_attention_comparison(done, Path(sweep_dir) / 'attention.png')}")
    parent = {"start-up": startup_s or 0.0, "report": time.perf_counter() - report_start}
    doc = write_sweep_profile(sweep_dir, plans, clock, parent, measure_peak=profile)
    if profile:
        print_profile(doc, console)
    planned = {job.dir(Path(sweep_dir)).resolve() for plan in plans for job in plan.jobs}
    unfinished = [r for r in records if r.status != "ok" and Path(r.run_dir).resolve() in planned]
    for r in unfinished:  # on stderr too, whatever the table showed: a log may keep only stderr
        err_console.print(f"job {r.run_dir} {r.status}: {r.error}", markup=False, highlight=False)
    if failed or unfinished:
        raise typer.Exit(1)


def _warn_if_busy(plans: list, launcher_given: dict, user_dir: Path | None) -> None:
    """One warning line when the machine is already loaded (jobs' threads as posenc would give them)."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.cpu_load import training_busy_warning
    from posenc_cli.sweep.hydra_bridge import compose_config

    first = next((job for plan in plans for job in plan.jobs), None)
    if first is None:
        return
    train = compose_config(first.overrides, user_dir).train
    n_jobs = launcher_given.get("n_jobs")
    jobs = int(n_jobs) if isinstance(n_jobs, int) and n_jobs > 0 else 1
    if (busy := training_busy_warning(train.device, train.threads, jobs)) is not None:
        err_console.print(f"[yellow]warning:[/] {escape(busy)}", highlight=False)


def launcher_line(name: str, given: dict) -> str:
    """Where the jobs will go: 'launcher submitit_slurm (partition=gpu, timeout_min=60; other settings: defaults)'."""
    where = {
        "basic": "one after another in this process",
        "joblib": "parallel processes on this machine",
        "submitit_local": "local processes through submitit",
        "submitit_slurm": "Slurm jobs",
    }.get(name, "Hydra launcher plugin")
    settings = ", ".join(f"{key}={value}" for key, value in given.items())
    detail = f"{settings}; other settings: Hydra's defaults" if settings else "Hydra's default settings"
    return f"launcher {name} ({where}): {detail}"


def _print_plan(name: str, plans: list, out: Path | None, launcher_name: str, launcher_given: dict) -> None:
    """The jobs of each stage, readable at 80 columns and piped: the overrides every job of a stage shares once,
    then one row per job with the overrides that tell it apart (its directory name), folded rather than cut."""
    total = sum(len(p.jobs) for p in plans)
    console.print(f"[bold]{name}[/]: {total} job(s) in {len(plans)} stage(s); dry run, nothing was started")
    console.print(escape(launcher_line(launcher_name, launcher_given)), highlight=False)
    for plan in plans:
        shared = " ".join(plan.fixed.values()) or "(none)"
        console.print(f"\n[bold]stage {escape(plan.stage.name)}[/] ({plan.stage.action}): {len(plan.jobs)} job(s)")
        common = Table.grid(padding=(0, 1))
        common.add_column(no_wrap=True)
        common.add_column(overflow="fold")  # wrapped under itself, never cut
        common.add_row("  every job:", escape(shared))
        console.print(common, highlight=False)
        with_parent = plan.stage.action == "extend"
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        table.add_column("job: its swept overrides", overflow="fold")
        table.add_column("label", overflow="fold")
        if with_parent:
            table.add_column("parent", overflow="fold")
        for job in plan.jobs:
            swept = " ".join(job.swept) or "(nothing swept)"
            table.add_row(swept, job.label, *([job.parent or ""] if with_parent else []))
        if not plan.jobs:
            table.add_row("(none)", f"no parent run matches '{plan.stage.parent}'", *([""] if with_parent else []))
        console.print(table)
