"""Running a sweep (the parent process): every job validated and checked against the sweep directory first, then
each stage through Hydra's multirun, one sweep at a time per directory (`SWEEP_LOCK`).

The parts: `sweep.spec` reads the sweep file, `sweep.plan` expands it into jobs (and records the plan),
`sweep.job` is the function each launched job runs, `sweep.markers` says from disk which jobs are done. A job
stopped by a signal ends the sweep (`SweepInterrupted`) before any later job or stage starts; running the same sweep
again resumes it.
"""

from __future__ import annotations

import contextlib
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from posenc_cli.errors import UserError
from posenc_cli.fsutil import exclusive_or_fail
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
) -> list[StagePlan]:
    """Validate every job, then run each stage (one Hydra multirun per parent group); returns the plan (`plans`,
    when the caller planned already: `plan_sweep(spec, user_overrides)`'s result).

    A job whose directory holds a run planned with another config is refused (`check_planned`). Done jobs
    (`job_status`) are skipped; others resume in their own directory. The sweep directory is locked for the whole
    run: a second sweep into it fails at once (`UserError`) and changes nothing. A job stopped by a signal ends the
    sweep with `SweepInterrupted` before any later job or stage starts.
    """
    launcher_overrides = launcher_overrides or []
    launcher_settings(launcher_overrides, user_config_dir)  # as the dry run checks them
    plans = plans if plans is not None else plan_sweep(spec, user_overrides)
    identities = plan_identities(plans, validate_plan(plans, user_config_dir))
    sweep_dir = Path(sweep_dir).resolve()
    with sweep_lock(sweep_dir):
        check_planned(sweep_dir, plans, identities)  # before anything is written
        write_planned(sweep_dir, identities)
        write_plan(spec, user_overrides, sweep_dir, plans, identities)
        session = uuid.uuid4().hex
        for plan in plans:
            _run_stage(plan, sweep_dir, session, launcher_overrides, user_config_dir, on_event)
    return plans


@contextlib.contextmanager
def sweep_lock(sweep_dir: Path) -> Iterator[None]:
    """Hold `SWEEP_LOCK` in `sweep_dir` (created if needed); another holder makes this fail at once, one line."""
    message = f"{sweep_dir} is in use by another posenc sweep; wait for it to finish or choose another --out"
    with exclusive_or_fail(sweep_dir / SWEEP_LOCK, lambda: UserError(message)):
        yield


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
    groups: dict[str | None, list[Job]] = {}
    for job in plan.jobs:
        groups.setdefault(job.parent, []).append(job)
    if not groups:
        say("skip", f"stage {plan.stage.name}: no parent run matches '{plan.stage.parent}'")
    for parent, jobs in groups.items():
        title = f"stage {plan.stage.name}" + (f" from {parent}" if parent else "")
        todo = [j for j in jobs if job_status(j.dir(sweep_dir)) != "done"]
        if not todo:
            say("skip", f"{title}: all {len(jobs)} job(s) already done")
            continue
        internal = [
            f"+{INTERNAL_KEY}.action={plan.stage.action}",
            f"+{INTERNAL_KEY}.sweep_dir={quote_value(str(sweep_dir))}",
            f"+{INTERNAL_KEY}.session={session}",
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
        swept = [f"{key}={','.join(values)}" for key, values in plan.swept.items()]
        internal_keys = ("action", "sweep_dir", "session", "parent_dir")
        exclude = [*plan.fixed, *(f"{INTERNAL_KEY}.{key}" for key in internal_keys)]
        launch_multirun(
            [*plan.fixed.values(), *swept, *internal],
            job=run_job,
            stage_dir=jobs[0].dir(sweep_dir).parent,
            subdir=None if plan.swept else DEFAULT_JOB,
            exclude_keys=exclude,
            launcher_overrides=launcher_overrides,
            user_config_dir=user_config_dir,
        )
        # A job that neither finished nor recorded a failure was stopped (by a signal, in this process or a worker).
        stopped = [j for j in todo if job_status(j.dir(sweep_dir)) in ("interrupted", "partial")]
        if stopped or session in STOPPED:
            names = [j.key for j in stopped] or ["a job"]
            raise SweepInterrupted(names, STOPPED.get(session))
