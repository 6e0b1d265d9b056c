"""`posenc sweep`: config-driven multiruns (`posenc compare` is in cli/compare.py)."""

from __future__ import annotations

import itertools
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from posenc_cli import api
from posenc_cli.cli.app import ConfigDirOption, app, console, err_console, handles_errors, split_args
from posenc_cli.errors import UserError, is_disk_message
from posenc_cli.report.gate import DEFAULT_COMPETENCE

_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}


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
    competence: Annotated[
        float,
        typer.Option(
            "--competence",
            help="Competence gate of the task tables and results.csv: a run whose in-distribution accuracy on a task "
            "is below this is marked 'not learned'. Also the gate of learned_only / not_learned_only stages.",
        ),
    ] = DEFAULT_COMPETENCE,
) -> None:
    """Run a sweep file from configs/sweep/ through Hydra's multirun, then print the comparison table.

    Example: [bold]posenc sweep extrapolation train.steps=200 pos=rope,alibi[/]. Parallel:
    [bold]hydra/launcher=joblib hydra.launcher.n_jobs=2[/]; Slurm: [bold]hydra/launcher=submitit_slurm[/].
    """
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.api.sweep_control import (
        SelectionPending,
        Stopped,
        SweepInterrupted,
        check_competence,
        interrupts_raise,
        startup_seconds,
    )
    from posenc_cli.cli.compare import print_comparison, text_table
    from posenc_cli.cli.profile import print_profile
    from posenc_cli.cli.tasks import print_task_summary

    startup_s = startup_seconds()  # interpreter start-up and the CLI's imports, before any work
    names, overrides = split_args(args)
    if len(names) > 1:
        raise UserError(f"one sweep name expected, got {', '.join(names)} (overrides need '=')")
    name = names[0] if names else "extrapolation"
    check_competence(competence)  # before anything is planned or run
    plan = api.plan_sweep(name, overrides, out, config_dir=config_dir, check=dry_run, competence=competence)
    if dry_run:
        _print_plan(
            plan.spec.name, plan.plans, out, plan.launcher_name, plan.launcher_given, plan.pending, gate=competence
        )
        return
    if busy := plan.busy_warning():
        err_console.print(f"[yellow]warning:[/] {escape(busy)}", highlight=False)
    sweep_dir = plan.sweep_dir
    console.print(f"[bold]sweep[/] {plan.spec.name} → {sweep_dir}", highlight=False)
    again = ["posenc", "sweep", name, *overrides, "--out", str(sweep_dir)]
    again += ["--config-dir", str(config_dir)] if config_dir else []
    again += ["--competence", str(competence)] if competence != DEFAULT_COMPETENCE else []
    try:
        with interrupts_raise():  # between jobs too (jobs in this process handle their own)
            ran = api.run_planned_sweep(
                plan, on_event=lambda kind, text: console.print(f"[cyan]{kind}[/] {text}", highlight=False)
            )
    except SweepInterrupted as e:
        err_console.print(f"sweep {e}. Resume with: {shlex.join(again)}", markup=False)
        raise typer.Exit(128 + (e.signum or 2)) from None
    except Stopped as e:
        err_console.print(f"sweep interrupted by SIGTERM. Resume with: {shlex.join(again)}", markup=False)
        raise typer.Exit(128 + e.signum) from None
    except SelectionPending as e:  # the grid ran as far as it could; the same command retries it and picks
        err_console.print(f"error: {e}. Resume with: {shlex.join(again)}", markup=False)
        raise typer.Exit(2) from None
    console.print(f"sweep finished in {ran.seconds:.0f} s", highlight=False)
    report = api.sweep_report(ran, viz=viz, profile=profile, startup_s=startup_s, competence=competence)
    print_comparison(report.comparison)
    print_task_summary(report.comparison.records, console, competence=competence)  # task scores, gated
    if report.curves is not None:
        console.print(text_table(report.curves))
    print_picks(report.picks)
    if report.attention is not None:
        console.print(f"wrote {report.attention}")
    if profile:
        print_profile(report.profile, console)
    for r in report.unfinished:  # on stderr too, whatever the table showed: a log may keep only stderr
        err_console.print(f"job {r.run_dir} {r.status}: {r.error}", markup=False, highlight=False)
    if report.failed or report.unfinished:
        raise typer.Exit(exit_code(report.unfinished))


def exit_code(unfinished: list) -> int:
    """2 when a job failed on the storage (full, read-only, forbidden: the user's to fix, as for every command),
    else 1 (a job's own failure)."""
    storage = [r for r in unfinished if r.status == "failed" and is_disk_message(r.error or "")]
    if storage:
        err_console.print(
            f"error: {len(storage)} job(s) failed on the storage ({_first(storage[0].error)}); free it and run the "
            "same command again",
            markup=False,
            highlight=False,
        )
        return 2
    return 1


def _first(text: str) -> str:
    return text.splitlines()[0] if text else ""


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


def print_picks(picks: dict[str, dict]) -> None:
    """Each select stage's pick, one line per group (scheme): 'picked by select (val_loss, lowest): ...'."""
    # deferred: keeps the sweep package off posenc --help start-up
    from posenc_cli.api.sweep_control import pick_lines

    for stage, doc in picks.items():
        goal = {"min": "lowest", "max": "highest"}.get(str(doc.get("goal")), "best")
        console.print(f"\n[bold]picked by stage {escape(stage)}[/] ({escape(str(doc.get('metric')))}, {goal}):")
        for line in pick_lines(doc):
            console.print(f"  {escape(line)}", highlight=False)


def _print_plan(
    name: str,
    plans: list,
    out: Path | None,
    launcher_name: str,
    launcher_given: dict,
    pending: dict[str, str] | None = None,
    *,
    gate: float = DEFAULT_COMPETENCE,
) -> None:
    """The jobs of each stage, readable at 80 columns and piped: the overrides every job of a stage shares once,
    then one row per job with the overrides that tell it apart (its directory name), folded rather than cut. A
    select stage says how it picks; a stage after it, the pick each job runs with or that it awaits it."""
    pending = pending or {}
    total = sum(len(p.jobs) for p in plans)
    console.print(f"[bold]{name}[/]: {total} job(s) in {len(plans)} stage(s); dry run, nothing was started")
    console.print(escape(launcher_line(launcher_name, launcher_given)), highlight=False)
    for plan in plans:
        shared = " ".join(plan.fixed.values()) or "(none)"
        after = f", after {plan.stage.after}" if plan.stage.after else ""
        title = f"stage {escape(plan.stage.name)}[/] ({plan.stage.action}{escape(after)})"
        console.print(f"\n[bold]{title}: {len(plan.jobs)} job(s)")
        common = Table.grid(padding=(0, 1))
        common.add_column(no_wrap=True)
        common.add_column(overflow="fold")  # wrapped under itself, never cut
        common.add_row("  every job:", escape(shared))
        if plan.stage.select is not None:
            rule = plan.stage.select
            goal = "lowest" if rule.metric == "val_loss" else "highest"
            per = " ".join(rule.group_by) or "all runs together"
            chosen = ", ".join(plan.chosen) or "nothing"
            common.add_row("  picks:", escape(f"{chosen} per {per}, by the {goal} {rule.metric}"))
        if plan.awaiting is not None:
            why = pending.get(plan.awaiting, "its grid has not run")
            common.add_row("  awaits:", escape(f"the pick of stage {plan.awaiting} ({why})"))
        if plan.awaiting_runs is not None:
            how = "which decide its parent runs" if plan.stage.action == "extend" else "each job runs by its own"
            common.add_row("  awaits:", escape(f"the runs of stage {plan.awaiting_runs} ({how})"))
        if plan.stage.runs_for is not None:
            left = _left_out_text(plan.left_out, gate)
            unit = "run" if plan.stage.gate_by else "group"
            every = f"every {unit} learned" if plan.stage.runs_for == "learned" else f"no {unit} learned"
            known = f"left out: {left}" if left else every
            passed = "passed" if plan.stage.runs_for == "learned" else "failed"
            unknown = (
                f"the jobs whose own run of stage {plan.stage.gate_by} {passed} the gate"
                if plan.stage.gate_by
                else f"the groups whose pick {passed} the gate"
            )
            common.add_row(f"  {plan.stage.runs_for} only:", escape(unknown if plan.waits else known))
        console.print(common, highlight=False)
        with_parent = plan.stage.action == "extend"
        with_pick = plan.stage.after is not None
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        table.add_column("job: its swept overrides", overflow="fold")
        table.add_column("label", overflow="fold")
        if with_parent:
            table.add_column("parent", overflow="fold")
        if with_pick:
            table.add_column("picked", overflow="fold")
        for job in plan.jobs:
            swept = " ".join(job.swept) or "(nothing swept)"
            parent = [job.parent or ""] if with_parent else []
            picked = ["(awaits the pick)" if job.picked is None else " ".join(job.picked) or "(nothing)"]
            table.add_row(swept, job.label, *parent, *(picked if with_pick else []))
        if not plan.jobs:
            why = (
                f"its parent runs await the pick of stage {plan.awaiting}"
                if plan.awaiting
                else f"its parent runs await the runs of stage {plan.awaiting_runs}"
                if plan.awaiting_runs and plan.stage.action == "extend"
                else f"every {'run' if plan.stage.gate_by else 'group'} "
                f"{'failed' if plan.stage.runs_for == 'learned' else 'passed'} the competence gate"
                if plan.left_out
                else f"no parent run matches '{plan.stage.parent}'"
            )
            table.add_row("(none)", why, *([""] if with_parent else []), *([""] if with_pick else []))
        console.print(table)


def _left_out_text(left_out: dict[str, Any], gate: float, shown: int = 6) -> str:
    """The groups (or runs) a gated stage left out, each with the gate's verdict; past `shown` of them, how many
    more (a `gate_by` stage over three seeds of seven schemes leaves out most of its 21 runs)."""
    parts = [f"{group} {verdict.text(gate)}" for group, verdict in itertools.islice(left_out.items(), shown)]
    more = len(left_out) - len(parts)
    return ", ".join(parts) + (f" and {more} more" if more > 0 else "")
