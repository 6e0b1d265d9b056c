"""A sweep's job: train or extend the job's run, evaluate it, mark it done; the function Hydra's launcher runs
(locally, in a joblib worker or on a Slurm node).

A job whose training a signal stopped is neither evaluated nor marked (`sweep.markers`): the sweep stops
(`runner.SweepInterrupted`) and a re-run resumes it from its checkpoint (Slurm's requeue path). A failure is recorded
in the job's directory instead of raised, so one failed job does not hide the others' results.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from posenc_cli import cpu_load
from posenc_cli.config import replace
from posenc_cli.data.sources import source_class
from posenc_cli.errors import Stopped, sigterm_raises
from posenc_cli.evaluation.runs import evaluate_each_run
from posenc_cli.evaluation.tasks import task_class
from posenc_cli.extension.plan import SearchThenScale, execute, plan_from_config
from posenc_cli.perf.profiling import EvalRecorder, JobProfile, TrainRecorder, eval_facts, write_job_profile
from posenc_cli.run.config_load import config_from_dict
from posenc_cli.run.meta import is_run_dir
from posenc_cli.run.progress import TrainDisplay
from posenc_cli.run.trackers import tracked
from posenc_cli.run.train import train
from posenc_cli.sweep import device_share
from posenc_cli.sweep.hydra_bridge import JobInfo
from posenc_cli.sweep.joblog import SignalSeen, job_console, log_label
from posenc_cli.sweep.markers import DONE_FILE, FAILED_FILE, job_status, mark_done, record_failure

INTERNAL_KEY = "posenc_job"  # the config key under which the parent loop passes a job its action, dirs and session
STOPPED: dict[str, int | None] = {}  # sweep sessions in which this process saw a job's training interrupted


def _job_threads(job: dict[str, Any], parallel_jobs: int) -> int:
    """`train.threads` of a job whose config leaves it 0: the free cores the sweep measured before launching
    (`free_cores` of the job's internal keys; else measured here), shared by the parallel jobs."""
    free = int(job.get("free_cores") or 0) or cpu_load.free_cores_now()
    if parallel_jobs != 1:
        return device_share.job_threads(parallel_jobs, os.cpu_count() or 1, free)
    return cpu_load.default_threads(free, torch.get_num_threads())


def run_job(raw: dict[str, Any], info: JobInfo) -> dict[str, Any]:
    """Train or extend, then evaluate, then mark the job done; record a failure in the job directory instead of
    raising. A done job returns at once; a job whose training a signal stopped is not evaluated (status
    "interrupted"), nor finished when SIGTERM comes during its evaluation, and later jobs of the same sweep in this
    process do not start."""
    job = raw.pop(INTERNAL_KEY, {}) or {}
    job_dir = info.output_dir
    session = str(job.get("session", ""))
    if session in STOPPED:
        return {"status": "interrupted", "dir": str(job_dir)}
    if job_status(job_dir) == "done":
        return {"status": "ok", "dir": str(job_dir)}
    started, profile = time.perf_counter(), JobProfile()
    print(f"== job {job_dir} ==", flush=True)  # the job's own log (a file under Slurm)
    (job_dir / FAILED_FILE).unlink(missing_ok=True)
    (job_dir / DONE_FILE).unlink(missing_ok=True)  # one of an earlier checkpoint
    try:
        with sigterm_raises():  # outside training's own handler (data, evaluation) SIGTERM stops the job too
            cfg = config_from_dict(raw)
            if cfg.train.threads == 0:  # the jobs share the free cores the sweep measured (on a GPU too)
                cfg = replace(cfg, train=replace(cfg.train, threads=_job_threads(job, info.parallel_jobs)))
            sweep_dir = Path(job["sweep_dir"]) if job.get("sweep_dir") else None
            action = str(job.get("action", "train"))
            log = job_console(log_label(info, action, sweep_dir))
            # parallel jobs on one GPU: this one starts once its memory is free (bounded wait), one start at a time
            with device_share.start_slot(cfg, sweep_dir or job_dir.parent, info.parallel_jobs, _say(log)) as release:
                if action == "train":
                    finished = _train_job(cfg, job_dir, sweep_dir, profile, log, release)
                else:
                    parent = Path(job["parent_dir"])
                    finished = _extend_job(cfg, job_dir, parent, sweep_dir, profile, log, release)
            if finished is not None:  # a signal stopped training (at its last step too): do not evaluate it
                STOPPED[session] = finished
                return {"status": "interrupted", "dir": str(job_dir)}
            _evaluate_job(cfg, job_dir, profile)
            write_job_profile(job_dir, profile, time.perf_counter() - started)  # informative; not a done marker
            mark_done(job_dir, info.name)
            return {"status": "ok", "dir": str(job_dir)}
    except Stopped as e:  # cells already measured stay stored; a re-run measures the rest
        STOPPED[session] = e.signum
        return {"status": "interrupted", "dir": str(job_dir)}
    except Exception as e:  # one failed job must not hide the others' results
        error = device_share.oom_reason(e, info.parallel_jobs) or f"{type(e).__name__}: {e}"
        try:
            record_failure(job_dir, info.name, error, traceback.format_exc())
        except OSError as write_error:  # e.g. a full disk: the reason still reaches the job's log
            print(f"job {job_dir} failed: {error} (its {FAILED_FILE} could not be written: {write_error})",
                  file=sys.stderr, flush=True)  # fmt: skip
        return {"status": "failed", "dir": str(job_dir), "error": error}


def _say(log: Console) -> Callable[[str], None]:
    return lambda text: log.print(text, markup=False, highlight=False)


def _job_display(cfg: Any, console: Console | None = None) -> Any:
    return TrainDisplay(console or Console(soft_wrap=True), live=False, log_every=cfg.train.log_every)


def _tracked(display: Any, cfg: Any, job_dir: Path, sweep_dir: Path | None) -> Any:
    """Each job is its own tracker run, grouped by its sweep."""
    if sweep_dir is None:
        return tracked(display, cfg, job_dir)
    return tracked(display, cfg, job_dir, group=sweep_dir.name, store=sweep_dir)


def _train_job(
    cfg: Any,
    job_dir: Path,
    sweep_dir: Path | None,
    profile: JobProfile,
    log: Console | None = None,
    started: Callable[[], None] = lambda: None,
) -> int | None:
    """Train (or resume) the job's run; None when training finished and no signal came, else the signal that stopped
    it (0: unknown) or that came at its last step. `started` is called after the first step (`device_share`)."""
    seen = SignalSeen()
    with _job_display(cfg, log) as display, _tracked(display, cfg, job_dir, sweep_dir) as callback:
        steps = device_share.released_after_first_step(callback, started)
        recorder = TrainRecorder(profile, cfg, seen.wrap(steps))
        result = train(cfg, job_dir, resume=is_run_dir(job_dir), callback=recorder)
    return (result.signal or 0) if result.stopped_reason == "interrupted" else seen.signum


def _extend_job(
    cfg: Any,
    job_dir: Path,
    parent_dir: Path,
    sweep_dir: Path | None,
    profile: JobProfile,
    log: Console | None = None,
    started: Callable[[], None] = lambda: None,
) -> int | None:
    """Extend (or resume the fine-tune of) the job's run as `posenc extend` does (`extension.plan`): a scaling, a
    remapping (`extend.remap`) or LongRoPE's search then scaling (`extend.longrope_search`, factors file written);
    like `_train_job`, None when it finished."""
    seen = SignalSeen()
    with _job_display(cfg, log) as display, _tracked(display, cfg, job_dir, sweep_dir) as callback:
        booked, start = sum(profile.seconds.values()), time.perf_counter()
        steps = device_share.released_after_first_step(callback, started)
        recorder = TrainRecorder(profile, cfg, seen.wrap(steps))
        plan = plan_from_config(cfg.extend, parent_dir, job_dir, threads=cfg.train.threads)
        outcome = execute(plan, callback=recorder)
        if isinstance(plan, SearchThenScale):
            profile.add("longrope search", outcome.search.seconds if outcome.search is not None else 0.0)
        fine_tune = sum(profile.seconds.values()) - booked  # its setup, steps, validation and saves
        profile.add("extend", time.perf_counter() - start - fine_tune)
    result = outcome.result
    return (getattr(result, "signal", None) or 0) if result.status == "interrupted" else seen.signum


def _evaluate_job(cfg: Any, job_dir: Path, profile: JobProfile | None = None) -> None:
    """The evaluation tasks of the job's data source (`DataSource.tasks`: eval-extrapolate for every source, passkey
    retrieval first for `data=passkey`), on one loaded model. Each cell is stored when measured; the job's done
    marker comes after all of them (`run_job`), so a job stopped during any evaluation measures its missing cells on
    the next run."""
    profile = profile if profile is not None else JobProfile()
    tasks = [task_class(name) for name in source_class(cfg.data.source).tasks]
    loading = time.perf_counter()

    def evaluate(run: Any, device: Any) -> dict[str, Any]:
        profile.add("eval load", time.perf_counter() - loading)
        result: dict[str, Any] = {}
        for task in tasks:
            if not task.profiled_per_length:
                with profile.phase(task.name):
                    task.evaluate_job(run, cfg, device=device)
                continue
            recorder = EvalRecorder(profile, run)
            result = task.evaluate_job(run, cfg, device=device, progress=recorder)
            entries = result.get("entries") or []
            recorder.book_flops(entries)
            eval_facts(profile, entries, device)
        return result

    evaluate_each_run([job_dir], evaluate, device=cfg.train.device, threads=cfg.train.threads)
