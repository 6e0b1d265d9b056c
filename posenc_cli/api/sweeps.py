"""`posenc sweep` as functions: `plan_sweep` (the jobs, checked like the dry run), `run_planned_sweep` (Hydra's
multirun), `sweep_report` (the comparison and profile written into the sweep directory); `sweep` does all three."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc_cli.analysis.compare import Comparison, write_outputs
from posenc_cli.analysis.gather import gather
from posenc_cli.api.comparing import TextTable, curve_view
from posenc_cli.evaluation.competence import check_threshold
from posenc_cli.report.gate import DEFAULT_COMPETENCE
from posenc_cli.run.config_compose import check_override_list

if TYPE_CHECKING:
    from posenc_cli.analysis.rows import RunRecord
    from posenc_cli.perf.profiling import StageClock
    from posenc_cli.sweep.plan import StagePlan
    from posenc_cli.sweep.spec import SweepSpec

__all__ = [
    "LOCAL_LAUNCHERS",
    "SweepPlan",
    "SweepReport",
    "SweepRun",
    "default_sweep_dir",
    "plan_sweep",
    "run_planned_sweep",
    "sweep",
    "sweep_report",
]

PathLike = str | Path


LOCAL_LAUNCHERS = ("basic", "joblib", "submitit_local")  # jobs run on this machine, so its load matters


@dataclass
class SweepPlan:
    """A sweep file planned with the user's overrides: its stages' jobs (`plans`), where it will run (`sweep_dir`)
    and on which Hydra launcher (`launcher_name`, with the settings given)."""

    name: str
    spec: SweepSpec
    overrides: list[str]  # the jobs' (everything but hydra...)
    launcher_overrides: list[str]
    plans: list[StagePlan]
    sweep_dir: Path
    launcher_name: str
    launcher_given: dict[str, Any]
    user_dir: Path | None
    pending: dict[str, str] = field(default_factory=dict)  # select stage -> why its pick is not made (dry run)
    competence: float = DEFAULT_COMPETENCE  # the gate of its learned_only / not_learned_only stages

    @property
    def jobs(self) -> int:
        return sum(len(p.jobs) for p in self.plans)

    def busy_warning(self) -> str | None:
        """The busy-machine advice for the jobs when they run on this machine (`LOCAL_LAUNCHERS`): the first job's
        threads as posenc would give them, times the launcher's n_jobs."""
        if self.launcher_name not in LOCAL_LAUNCHERS:
            return None
        # deferred: Hydra
        from posenc_cli.cpu_load import training_busy_warning
        from posenc_cli.run.config_compose import compose_config

        first = next((job for plan in self.plans for job in plan.jobs), None)
        if first is None:
            return None
        train_cfg = compose_config(first.overrides, self.user_dir).train
        n_jobs = self.launcher_given.get("n_jobs")
        jobs = int(n_jobs) if isinstance(n_jobs, int) and n_jobs > 0 else 1
        return training_busy_warning(train_cfg.device, train_cfg.threads, jobs)


def plan_sweep(
    name: str = "extrapolation",
    overrides: Sequence[str] = (),
    out: PathLike | None = None,
    *,
    config_dir: PathLike | None = None,
    check: bool = False,
    competence: float = DEFAULT_COMPETENCE,
) -> SweepPlan:
    """Plan sweep file `name` (configs/sweep/NAME.yaml, or in `config_dir`) with `overrides` (`hydra...` ones go to
    the launcher, checked here as the launch checks them). `check`: also compose and validate every job, and refuse
    a job in `out` planned with another config, as running it would (the dry run); a select stage whose grid in
    `out` is finished has its pick applied to the stages after it (as the sweep would pick; nothing is written),
    else `SweepPlan.pending` says why not. `competence`: the gate a `learned_only` / `not_learned_only` stage compares
    each pick with (the task tables' gate). Runs nothing."""
    # deferred: Hydra
    from posenc_cli.config import config_dir as packaged_config_dir
    from posenc_cli.sweep.hydra_bridge import launcher_settings
    from posenc_cli.sweep.plan import check_planned, plan_identities, validate_plan
    from posenc_cli.sweep.plan import plan_sweep as plan_stages
    from posenc_cli.sweep.spec import find_sweep_file, load_sweep_spec

    overrides = check_override_list(overrides)  # one string holding several: refused in one line
    user_dir = Path(config_dir) if config_dir else None
    launcher = [o for o in overrides if o.lstrip("+~").startswith("hydra")]
    task = [o for o in overrides if o not in launcher]
    roots = [p for p in (user_dir, packaged_config_dir()) if p is not None]
    spec = load_sweep_spec(find_sweep_file(name, roots))
    launcher_name, launcher_given = launcher_settings(launcher, user_dir)  # as the launch itself would check
    check_threshold(competence)
    plans = plan_stages(spec, task, gate=competence)
    pending: dict[str, str] = {}
    if check:
        if out is not None and Path(out).is_dir():  # the picks the sweep would make from what is finished there
            plans, pending = _with_picks(spec, task, plans, Path(out).resolve(), competence)
        else:
            pending = {p.stage.name: "its grid has not run" for p in plans if p.stage.select is not None}
        configs = validate_plan(plans, user_dir)
        if out is not None and Path(out).is_dir():  # a job there planned with another config is refused
            check_planned(Path(out).resolve(), plans, plan_identities(plans, configs))
    sweep_dir = Path(out) if out is not None else default_sweep_dir(spec.name)
    return SweepPlan(
        name,
        spec,
        task,
        launcher,
        plans,
        sweep_dir,
        launcher_name,
        launcher_given,
        user_dir,
        pending=pending,
        competence=competence,
    )


def _with_picks(
    spec: SweepSpec, overrides: list[str], plans: list[StagePlan], sweep_dir: Path, gate: float
) -> tuple[list[StagePlan], dict[str, str]]:
    """`plans` with the pick of every select stage whose grid in `sweep_dir` is finished (read, not recorded), and
    why each other select stage has none; a gated stage (`learned_only` / `not_learned_only`) keeps the jobs the
    gate's verdicts on the runs it follows say it would (a `gate_by` stage whose runs have not all run awaits them)."""
    # deferred: Hydra
    from posenc_cli.sweep.gating import read_gates
    from posenc_cli.sweep.plan import plan_sweep as plan_stages
    from posenc_cli.sweep.select import SelectionPending, make_pick

    picks, pending = {}, {}
    for plan in plans:
        if plan.stage.select is None:
            continue
        try:
            picks[plan.stage.name] = make_pick(plan.stage.name, plan.stage.select, plan.jobs, plan.chosen, sweep_dir)
        except SelectionPending as e:
            pending[plan.stage.name] = str(e)
    if not picks:
        return plans, pending
    plans = plan_stages(spec, overrides, picks, gate=gate, gates=read_gates(plans, picks, sweep_dir, gate))
    if any(plan.awaiting_runs for plan in plans):  # the runs a gate_by stage follows, now that their jobs are known
        plans = plan_stages(spec, overrides, picks, gate=gate, gates=read_gates(plans, picks, sweep_dir, gate))
    return plans, pending


def default_sweep_dir(name: str) -> Path:
    return Path("outputs") / "sweeps" / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"


@dataclass
class SweepRun:
    """A sweep that ran: its plan, the stage clock (`perf.profiling.StageClock`) and its wall time."""

    plan: SweepPlan
    clock: StageClock
    seconds: float


def run_planned_sweep(plan: SweepPlan, *, on_event: Callable[[str, str], None] | None = None) -> SweepRun:
    """Run `plan`'s stages through Hydra's multirun (`sweep.runner.run_sweep`; done jobs are skipped, others
    resume). `on_event(kind, text)` hears each stage start or skip. A job stopped by a signal raises
    `sweep.runner.SweepInterrupted`; the same call resumes it."""
    # deferred: Hydra, torch
    from posenc_cli.perf.profiling import StageClock
    from posenc_cli.sweep.runner import run_sweep

    start = time.perf_counter()
    clock = StageClock(on_event)
    plan.plans = run_sweep(
        plan.spec,
        plan.overrides,
        plan.sweep_dir,
        launcher_overrides=plan.launcher_overrides,
        user_config_dir=plan.user_dir,
        on_event=clock,
        plans=plan.plans,  # planned once, by plan_sweep above
        gate=plan.competence,
    )
    clock.finish()
    return SweepRun(plan, clock, time.perf_counter() - start)


@dataclass
class SweepReport:
    """A finished sweep's outputs: the comparison of its runs (results.csv/json and plots written in the sweep
    directory), the attention figure when asked, profile.json's document, the failed jobs and the planned jobs
    without results (`unfinished`)."""

    sweep_dir: Path
    comparison: Comparison
    failed: int
    unfinished: list[RunRecord]
    profile: dict[str, Any]
    attention: Path | None = None
    picks: dict[str, dict[str, Any]] = field(default_factory=dict)  # select stage -> its pick.json
    curves: TextTable | None = None  # the learning curves among its runs (a grid's and a longer stage's), if any


def sweep_report(
    ran: SweepRun,
    *,
    viz: bool = False,
    profile: bool = False,
    startup_s: float | None = None,
    competence: float = DEFAULT_COMPETENCE,
) -> SweepReport:
    """Compare the sweep's runs into its directory (`analysis.compare.write_outputs`; results.csv's task rows flagged
    by the competence gate at `competence`), draw their attention panels (`viz`: attention.png), and write
    profile.json (`profile`: with the matmul peak measured)."""
    # deferred: matplotlib, torch
    from posenc_cli.perf.profiling import write_sweep_profile

    report_start = time.perf_counter()
    sweep_dir = ran.plan.sweep_dir
    records = gather([sweep_dir])
    comp = Comparison(records, competence=competence)
    comp.written = write_outputs(records, sweep_dir, competence)
    attention = None
    if viz:
        # deferred: matplotlib
        from posenc_cli.analysis.viz import write_attention_comparison

        done = [r.run_dir for r in records if r.status == "ok"]
        if done:
            attention = write_attention_comparison(done, Path(sweep_dir) / "attention.png")
    parent = {"start-up": startup_s or 0.0, "report": time.perf_counter() - report_start}
    doc = write_sweep_profile(sweep_dir, ran.plan.plans, ran.clock, parent, measure_peak=profile)
    planned = {job.dir(Path(sweep_dir)).resolve() for plan in ran.plan.plans for job in plan.jobs}
    unfinished = [r for r in records if r.status != "ok" and Path(r.run_dir).resolve() in planned]
    failed = sum(r.status == "failed" for r in records)
    picks = _sweep_picks(sweep_dir, ran.plan.plans)
    curves = curve_view(comp.curve_frame())
    return SweepReport(sweep_dir, comp, failed, unfinished, doc, attention, picks, curves)


def _sweep_picks(sweep_dir: PathLike, plans: Sequence[StagePlan]) -> dict[str, dict[str, Any]]:
    """The recorded pick (`<sweep dir>/<stage>/pick.json`, see `sweep.select`) of each select stage of `plans`."""
    # deferred: the sweep package
    from posenc_cli.sweep.select import read_pick

    found = {p.stage.name: read_pick(Path(sweep_dir), p.stage.name) for p in plans if p.stage.select is not None}
    return {name: doc for name, doc in found.items() if doc is not None}


def sweep(
    name: str = "extrapolation",
    overrides: Sequence[str] = (),
    out: PathLike | None = None,
    *,
    config_dir: PathLike | None = None,
    on_event: Callable[[str, str], None] | None = None,
    viz: bool = False,
    profile: bool = False,
    competence: float = DEFAULT_COMPETENCE,
) -> SweepReport:
    """Plan, run and compare sweep file `name` into `out` (default outputs/sweeps/<time>-<name>; re-use it to
    resume): `plan_sweep`, `run_planned_sweep`, `sweep_report` (`competence`: the task tables' gate)."""
    check_threshold(competence)
    return sweep_report(
        run_planned_sweep(
            plan_sweep(name, overrides, out, config_dir=config_dir, competence=competence), on_event=on_event
        ),
        viz=viz,
        profile=profile,
        competence=competence,
    )
