"""Running a sweep (the parent process): every job validated and checked against the sweep directory first, then
each stage through Hydra's multirun, one sweep at a time per directory (`SWEEP_LOCK`).

The parts: `sweep.spec` reads the sweep file, `sweep.plan` expands it into jobs (and records the plan),
`sweep.job` is the function each launched job runs, `sweep.markers` says from disk which jobs are done. A job
stopped by a signal ends the sweep (`SweepInterrupted`) before any later job or stage starts; running the same sweep
again resumes it.

A select stage's pick (`sweep.select`) is made from disk once its stage has run (finished jobs skipped as always), and
recorded in its directory; the stages after it are then planned with it, checked against the sweep directory and
recorded before they run. A job planned with the very config of a done job of an earlier stage (seed 0 of a pick,
which the grid trained already) is copied from it (`sweep.reuse`), not trained again. A pick that cannot be made
(grid points unfinished or failed) stops the sweep before any stage that needs it (`select.SelectionPending`);
running the sweep again retries those points and picks.
"""

from __future__ import annotations

import contextlib
import math
import signal
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from posenc_cli import cpu_load
from posenc_cli.errors import UserError
from posenc_cli.fsutil import exclusive_or_fail
from posenc_cli.report.gate import DEFAULT_COMPETENCE
from posenc_cli.sweep.gating import read_gates
from posenc_cli.sweep.hydra_bridge import launch_multirun, launcher_settings, quote_value
from posenc_cli.sweep.identity import write_planned
from posenc_cli.sweep.job import INTERNAL_KEY, STOPPED, run_job
from posenc_cli.sweep.markers import job_status, record_failure
from posenc_cli.sweep.plan import (
    DEFAULT_JOB,
    Job,
    StagePlan,
    check_planned,
    plan_identities,
    plan_sweep,
    validate_plan,
    write_plan,
)
from posenc_cli.sweep.reuse import reuse_identical
from posenc_cli.sweep.select import (
    GroupKey,
    Pick,
    Reader,
    SelectionPending,
    group_of,
    group_text,
    line_value,
    make_pick,
    write_pick,
)
from posenc_cli.sweep.spec import SweepSpec

SWEEP_LOCK = ".sweep.lock"


class SweepInterrupted(Exception):
    """A signal stopped a job (its training saved a checkpoint; its evaluation kept the cells it measured), and
    re-running the sweep resumes it."""

    def __init__(self, jobs: list[str], signum: int | None) -> None:
        self.jobs = jobs
        self.signum = signum
        name = signal.Signals(signum).name if signum else "a signal"
        super().__init__(f"interrupted by {name}: {', '.join(jobs)} did not finish (nothing of it was marked done)")


def run_sweep(
    spec: SweepSpec,
    user_overrides: list[str],
    sweep_dir: Path,
    *,
    launcher_overrides: list[str] | None = None,
    user_config_dir: Path | None = None,
    on_event: Callable[[str, str], None] | None = None,
    plans: list[StagePlan] | None = None,
    read_metric: Reader | None = None,
    gate: float = DEFAULT_COMPETENCE,
) -> list[StagePlan]:
    """Validate every job, then run each stage (one Hydra multirun per parent group); returns the plan (`plans`,
    when the caller planned already: `plan_sweep(spec, user_overrides)`'s result), with every pick applied.

    A job whose directory holds a run planned with another config is refused (`check_planned`). Done jobs
    (`job_status`) are skipped; others resume in their own directory. After a select stage runs, its pick is made
    and recorded (`read_metric`: the metric reader, the stage's own unless given), and the stages after it are
    planned with it; a pick that cannot be made raises `SelectionPending` before a stage that needs it starts. The
    sweep directory is locked for the whole run: a second sweep into it fails at once (`UserError`) and changes
    nothing. A job stopped by a signal ends the sweep with `SweepInterrupted` before any later job or stage starts.
    `gate`: the competence a `learned_only` / `not_learned_only` stage compares each pick with.
    """
    launcher_overrides = launcher_overrides or []
    launcher_settings(launcher_overrides, user_config_dir)  # as the dry run checks them
    plans = plans if plans is not None else plan_sweep(spec, user_overrides, gate=gate)
    configs = validate_plan(plans, user_config_dir)
    identities = plan_identities(plans, configs)
    sweep_dir = Path(sweep_dir).resolve()
    say = on_event or (lambda kind, text: None)
    with sweep_lock(sweep_dir):
        check_planned(sweep_dir, plans, identities)  # before anything is written
        write_planned(sweep_dir, identities)
        write_plan(spec, user_overrides, sweep_dir, plans, identities)
        session = uuid.uuid4().hex
        picks: dict[str, Pick] = {}
        index = 0
        while index < len(plans):
            plan = plans[index]
            if plan.waits:  # what it awaits ran (its select stage picked, else `_pick` raised): plan with it
                waiting = {p.stage.name for p in plans if p.waits}
                gates = read_gates(plans, picks, sweep_dir, gate, read_metric)
                plans = plan_sweep(spec, user_overrides, picks, gate=gate, gates=gates)
                if plans[index].waits:
                    raise RuntimeError(f"stage {plan.stage.name} still awaits {plan.awaiting or plan.awaiting_runs}")
                newly = [p for p in plans if p.stage.name in waiting and not p.waits]
                configs.update(validate_plan(newly, user_config_dir))
                identities = plan_identities(plans, configs)
                check_planned(sweep_dir, newly, identities)
                keys = {job.key for p in newly for job in p.jobs}
                write_planned(sweep_dir, {k: v for k, v in identities.items() if k in keys})
                write_plan(spec, user_overrides, sweep_dir, plans, identities)
                for p in newly:
                    for group, verdict in p.left_out.items():
                        say("skip", f"stage {p.stage.name}: {group} {verdict.text(gate)}: no jobs")
                continue
            earlier = [job for p in plans[:index] for job in p.jobs]
            reuse_identical(plan.jobs, earlier, identities, sweep_dir, say)  # e.g. seed 0 of a select stage's pick
            _run_stage(plan, sweep_dir, session, launcher_overrides, user_config_dir, on_event)
            if plan.stage.select is not None:
                pick = _pick(plan, plans, sweep_dir, read_metric, say)
                if pick is not None:
                    picks[plan.stage.name] = pick
            index += 1
    return plans


def _pick(
    plan: StagePlan,
    plans: list[StagePlan],
    sweep_dir: Path,
    read_metric: Reader | None,
    say: Callable[[str, str], None],
) -> Pick | None:
    """Make and record a select stage's pick from disk; when it cannot, stop the sweep if a later stage needs it
    (`SelectionPending`), else say why and go on."""
    rule = plan.stage.select
    assert rule is not None
    name = plan.stage.name
    try:
        pick = make_pick(name, rule, plan.jobs, plan.chosen, sweep_dir, read_metric)
    except SelectionPending as e:
        if any(p.stage.after == name for p in plans):
            raise
        say("skip", str(e))
        return None
    path = write_pick(sweep_dir, pick)
    for group, point in pick.chosen_points.items():
        shown = " ".join(point.setting) or "(nothing to choose)"
        say("pick", f"stage {name}: {group_text(rule.group_by, group)}: {shown} ({rule.metric} {point.value:.4g})")
    say("pick", f"stage {name}: recorded in {path}")
    return pick


@contextlib.contextmanager
def sweep_lock(sweep_dir: Path) -> Iterator[None]:
    """Hold `SWEEP_LOCK` in `sweep_dir` (created if needed); another holder makes this fail at once, one line."""
    message = f"{sweep_dir} is in use by another posenc sweep; wait for it to finish or choose another --out"
    with exclusive_or_fail(sweep_dir / SWEEP_LOCK, lambda: UserError(message)):
        yield


@dataclass(frozen=True, kw_only=True)
class _Launch:
    """One Hydra multirun of a stage: its jobs, the overrides all of them share (`fixed`, left out of the jobs'
    directory names; `fixed_keys` names their keys), the swept ones and its parent run (extend)."""

    title: str
    jobs: list[Job]
    fixed: list[str]
    fixed_keys: list[str]
    swept: dict[str, list[str]]
    parent: str | None


def _launches(plan: StagePlan) -> list[_Launch]:
    """A stage's multiruns: one per parent run (extend), one per group of its select stage (a stage `after` one:
    each group with its pick, whose keys are left out of the directory names as fixed ones are), else one."""
    name = plan.stage.name
    if plan.stage.after is None:
        by_parent: dict[str | None, list[Job]] = {}
        for job in plan.jobs:
            by_parent.setdefault(job.parent, []).append(job)
        return [
            _Launch(
                title=f"stage {name}" + (f" from {parent}" if parent else ""),
                jobs=jobs,
                fixed=list(plan.fixed.values()),
                fixed_keys=list(plan.fixed),
                swept=plan.swept,
                parent=parent,
            )
            for parent, jobs in by_parent.items()
        ]
    by_group: dict[GroupKey, list[Job]] = {}
    for job in plan.jobs:
        by_group.setdefault(group_of(job.overrides, plan.group_by), []).append(job)
    launches = []
    for merged in _merged_groups(by_group, plan.group_by):
        for part in _product_parts([by_group[group] for group in merged], plan.swept):
            groups = list(dict.fromkeys(group_of(job.overrides, plan.group_by) for job in part))
            picked = part[0].picked or []
            shown = ", ".join(group_text(plan.group_by, group) for group in groups)
            launches.append(
                _Launch(
                    title=f"stage {name} for {shown} ({' '.join(picked) or 'nothing picked'})",
                    jobs=part,
                    fixed=[*(line for key, line in plan.fixed.items() if key not in plan.picked_keys), *picked],
                    fixed_keys=[*plan.fixed, *plan.picked_keys],
                    swept=_swept_values(part, plan.swept),
                    parent=None,
                )
            )
    return launches


def _product_parts(groups: list[list[Job]], swept: dict[str, list[str]]) -> list[list[Job]]:
    """The jobs of `groups` split into multiruns, each running exactly its jobs (Hydra sweeps the product of the
    values): all together where they are such a product, else each group where it is, else each job alone."""
    jobs = [job for group in groups for job in group]
    if _is_product(jobs, swept):
        return [jobs]
    return [part for group in groups for part in ([group] if _is_product(group, swept) else [[j] for j in group])]


def _swept_values(jobs: Sequence[Job], swept: dict[str, list[str]]) -> dict[str, list[str]]:
    """The values each swept key takes in `jobs`, in the stage's order (a gated stage may have left some out)."""
    return {
        key: [v for v in values if any(line_value(job.swept, key) == v for job in jobs)]
        for key, values in swept.items()
    }


def _is_product(jobs: Sequence[Job], swept: dict[str, list[str]]) -> bool:
    """Whether one multirun of `jobs`' swept values runs exactly `jobs` (Hydra sweeps their product): not when a
    gated stage kept seed 1 of one scheme and seeds 1 and 2 of another."""
    size = math.prod(len(values) for values in _swept_values(jobs, swept).values())
    return size == len({job.name for job in jobs})


def _merged_groups(by_group: dict[GroupKey, list[Job]], group_by: Sequence[str]) -> list[list[GroupKey]]:
    """The groups of a stage after a select stage, those with the same pick in one multirun (so that its launcher
    runs them in parallel: a group often holds one job) where their product is exactly them, i.e. grouped by one
    key; each group alone otherwise."""
    by_pick: dict[tuple[str, ...], list[GroupKey]] = {}
    for group, jobs in by_group.items():
        if len(group_by) != 1 or any(v is None for v in group):
            by_pick[("", *map(str, group))] = [group]  # a key of its own: never merged
            continue
        by_pick.setdefault(tuple(jobs[0].picked or []), []).append(group)
    return list(by_pick.values())


def _run_stage(
    plan: StagePlan,
    sweep_dir: Path,
    session: str,
    launcher_overrides: list[str],
    user_config_dir: Path | None,
    on_event: Callable[[str, str], None] | None,
) -> None:
    """One stage: a Hydra multirun per parent group, for the groups with jobs that are not done."""
    say = on_event or (lambda kind, text: None)
    if not plan.jobs and plan.stage.action == "extend":
        say("skip", f"stage {plan.stage.name}: no parent run matches '{plan.stage.parent}'")
    for launch in _launches(plan):
        title, jobs, parent = launch.title, launch.jobs, launch.parent
        todo = [j for j in jobs if job_status(j.dir(sweep_dir)) != "done"]
        if not todo:
            say("skip", f"{title}: all {len(jobs)} job(s) already done")
            continue
        action = "train" if plan.stage.action == "select" else plan.stage.action  # a select stage's jobs train
        internal = [
            f"+{INTERNAL_KEY}.action={action}",
            f"+{INTERNAL_KEY}.sweep_dir={quote_value(str(sweep_dir))}",
            f"+{INTERNAL_KEY}.session={session}",
            f"+{INTERNAL_KEY}.free_cores={cpu_load.free_cores_now()}",  # measured before the jobs load the cores
        ]
        if parent is not None:
            parent_dir = sweep_dir / parent
            if job_status(parent_dir) != "done":
                for job in todo:
                    record_failure(job.dir(sweep_dir), job.name, f"parent run {parent} did not finish")
                say("fail", f"{title}: parent run did not finish; {len(todo)} job(s) marked failed")
                continue
            internal.append(f"+{INTERNAL_KEY}.parent_dir={quote_value(str(parent_dir))}")
        say("run", f"{title}: {len(todo)} of {len(jobs)} job(s) to run")
        swept = [f"{key}={','.join(values)}" for key, values in launch.swept.items()]
        internal_keys = ("action", "sweep_dir", "session", "free_cores", "parent_dir")
        exclude = [*launch.fixed_keys, *(f"{INTERNAL_KEY}.{key}" for key in internal_keys)]
        launch_multirun(
            [*launch.fixed, *swept, *internal],
            job=run_job,
            stage_dir=jobs[0].dir(sweep_dir).parent,
            subdir=None if launch.swept else DEFAULT_JOB,
            exclude_keys=exclude,
            launcher_overrides=launcher_overrides,
            user_config_dir=user_config_dir,
        )
        # A job that neither finished nor recorded a failure was stopped (by a signal, in this process or a worker).
        stopped = [j for j in todo if job_status(j.dir(sweep_dir)) in ("interrupted", "partial")]
        if stopped or session in STOPPED:
            names = [j.key for j in stopped] or ["a job"]
            raise SweepInterrupted(names, STOPPED.get(session))
