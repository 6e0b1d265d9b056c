"""Config-driven sweeps: sweep files, their expansion into jobs, the per-job function, and result gathering.

A sweep file (`configs/sweep/NAME.yaml`, or `sweep/NAME.yaml` in a user's `--config-dir`) declares global overrides
and one or more stages. Each stage is one Hydra multirun (see `hydra_bridge.launch_multirun`): stage `train` jobs
train and evaluate a run; `extend` jobs derive a run from an earlier stage's run (RoPE scaling, optional
fine-tune) and evaluate it. Job directories are `<sweep dir>/<stage>/<swept key=value,...>/`, so a job's identity
is stable across re-runs and a re-run skips or resumes each job in place.

A job is done only by its marker `done.json`, written last and atomically after its training finished (meta status
"complete", not "interrupted") and its evaluation wrote every cell; it names the checkpoint it vouches for, so a job
trained further afterwards is not done any more. `job_status` is the one reader of that definition. A job whose
training a signal stopped is neither evaluated nor marked: the sweep stops (`SweepInterrupted`) and a re-run resumes
it from its checkpoint (Slurm's requeue path). One sweep at a time writes a sweep directory (`SWEEP_LOCK`).

A job's identity is its resolved config, not only its directory name. Hydra gives every multirun a directory of
its own (a timestamp), and so does `posenc sweep` without `--out`; `--out DIR` names a directory to continue. The
sweep directory records, per job, the config it was planned with (`sweep.identity`: the composed config without the
keys that only change speed or logging, and a hash of it; an extend job's includes its parent's hash). A re-run
into the same directory reuses a job only if it is planned with the same config: jobs new to the grid run beside
the old ones, and a job whose directory holds a run planned differently (`pos=nope` then `pos=alibi`, both
`train/default`; `train.steps=20` then `30`) is refused before anything runs, in one line naming the first setting
that differs. Numbers measured under other settings than a row's label are never shown under it. Directories from
before the record (no entry) are compared through a train job's own `config.yaml`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from rich.console import Console

from posenc_cli.config import Config, replace, suggest
from posenc_cli.data.sources import source_class
from posenc_cli.errors import CheckpointError, ConfigError, UserError
from posenc_cli.evaluation.perplexity import evaluate_each_run
from posenc_cli.evaluation.results import checkpoint_identity
from posenc_cli.evaluation.tasks import task_class
from posenc_cli.extension.extend import extend_run, remap_run
from posenc_cli.extension.longrope_search import extend_with_search
from posenc_cli.fsutil import atomic_write_json, exclusive_or_fail
from posenc_cli.perf.profiling import EvalRecorder, JobProfile, TrainRecorder, eval_facts, write_job_profile
from posenc_cli.positional.remap import RemapConfig
from posenc_cli.run.config_load import config_from_dict
from posenc_cli.run.interrupts import Stopped, sigterm_raises
from posenc_cli.run.meta import RunMeta, is_run_dir, read_run_meta
from posenc_cli.run.progress import TrainDisplay
from posenc_cli.run.trackers import tracked
from posenc_cli.run.train import check_budget, train
from posenc_cli.sweep.hydra_bridge import (
    JobInfo,
    compose_config,
    job_name,
    launch_multirun,
    launcher_settings,
    parse_overrides,
    quote_value,
)
from posenc_cli.sweep.identity import (
    difference,
    identity_hash,
    job_identity,
    read_planned,
    run_config_identity,
    write_planned,
)
from posenc_cli.sweep.joblog import SignalSeen, job_console, log_label

FAILED_FILE = "failed.json"
DONE_FILE = "done.json"  # a job's completion marker, written last
SWEEP_LOCK = ".sweep.lock"
FAULT_ENV = "POSENC_DEBUG_SWEEP_FAULT"  # test hook, see `_Fault`
PLAN_FILE = "sweep.json"
INTERNAL_KEY = "posenc_job"
DEFAULT_JOB = "default"  # the directory of the one job of a stage that sweeps nothing


@dataclass(kw_only=True)
class StageSpec:
    name: str
    action: Literal["train", "extend"] = "train"
    params: dict[str, str] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    parent: str | None = None
    label: str | None = None


@dataclass(kw_only=True)
class SweepSpec:
    name: str
    path: Path
    overrides: list[str] = field(default_factory=list)
    stages: list[StageSpec] = field(default_factory=list)


@dataclass(kw_only=True)
class Job:
    """One job of a stage: its directory name is Hydra's override_dirname of `swept` (sorted key=value lines)."""

    stage: str
    action: str
    name: str
    swept: list[str]
    overrides: list[str]
    label: str
    parent: str | None = None

    def dir(self, sweep_dir: Path) -> Path:
        return stage_dir(sweep_dir, self.stage, self.parent_group) / self.name

    @property
    def key(self) -> str:
        """The job's directory relative to its sweep directory ('train/pos=rope', 'extend/pos=rope/default')."""
        return self.dir(Path()).as_posix()

    @property
    def parent_group(self) -> str | None:
        return None if self.parent is None else self.parent.split("/", 1)[1]


# ----------------------------------------------------------------------------------------------------------------
# Sweep files.


def find_sweep_file(name: str, config_dirs: list[Path]) -> Path:
    """`configs/sweep/NAME.yaml`, looked up in the user's config dir first."""
    for root in config_dirs:
        candidate = root / "sweep" / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    available = sorted({p.stem for root in config_dirs for p in (root / "sweep").glob("*.yaml")})
    hint = suggest(name, available)
    raise ConfigError(f"no sweep file named '{name}'{hint} (available: {', '.join(available) or 'none'})")


def load_sweep_spec(path: Path) -> SweepSpec:
    """Parse a sweep file (safe YAML) and check its shape."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from e
    if not isinstance(raw, dict) or not isinstance(raw.get("stages"), list) or not raw["stages"]:
        raise ConfigError(f"{path}: a sweep file needs a non-empty 'stages' list")
    unknown = set(raw) - {"overrides", "stages", "description"}
    if unknown:
        key = str(sorted(unknown, key=str)[0])
        hint = suggest(key, ["description", "overrides", "stages"])
        raise ConfigError(f"{path}: unknown sweep key '{key}'{hint} (valid: description, overrides, stages)")
    stages = []
    for i, st in enumerate(raw["stages"]):
        if not isinstance(st, dict) or "name" not in st:
            raise ConfigError(f"{path}: stage {i} needs a 'name'")
        valid = ["name", "action", "params", "overrides", "parent", "label"]
        bad = set(st) - set(valid)
        if bad:
            key = str(sorted(bad, key=str)[0])
            hint = suggest(key, valid)
            raise ConfigError(
                f"{path}: stage '{st['name']}' has unknown key '{key}'{hint} (valid: {', '.join(sorted(valid))})"
            )
        action = st.get("action", "train")
        if action not in ("train", "extend"):
            raise ConfigError(f"{path}: stage '{st['name']}': action must be train or extend, got {action!r}")
        if action == "extend" and not st.get("parent"):
            raise ConfigError(f"{path}: extend stage '{st['name']}' needs parent: <stage>/<key=value,...>")
        params = {str(k): _param_str(v) for k, v in (st.get("params") or {}).items()}
        stages.append(
            StageSpec(
                name=str(st["name"]),
                action=action,
                params=params,
                overrides=[str(o) for o in st.get("overrides") or []],
                parent=st.get("parent"),
                label=st.get("label"),
            )
        )
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: stage names must be unique")
    return SweepSpec(
        name=Path(path).stem, path=Path(path), overrides=[str(o) for o in raw.get("overrides") or []], stages=stages
    )


def _param_str(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


# ----------------------------------------------------------------------------------------------------------------
# Expansion into jobs (posenc's own code, used by --dry-run and to find results afterwards).


def stage_dir(sweep_dir: Path, stage: str, parent_group: str | None = None) -> Path:
    base = Path(sweep_dir) / stage
    return base if parent_group is None else base / parent_group


@dataclass(kw_only=True)
class StagePlan:
    """A stage expanded: its fixed and swept overrides, and its jobs (one group per parent run)."""

    stage: StageSpec
    fixed: dict[str, str]
    swept: dict[str, list[str]]
    jobs: list[Job]


def plan_sweep(spec: SweepSpec, user_overrides: list[str]) -> list[StagePlan]:
    """Expand every stage into its jobs: the cartesian product of swept values, as Hydra's basic sweeper does.

    Precedence: sweep-file globals < stage overrides < stage params < the user's command-line overrides. A user's
    comma list sweeps the stages whose params name that key (or the first stage if none does).
    """
    user = parse_overrides(user_overrides)
    stage_keys = [set(st.params) for st in spec.stages]
    plans: list[StagePlan] = []
    for index, st in enumerate(spec.stages):
        fixed: dict[str, str] = {}
        swept: dict[str, list[str]] = {}
        stage_params = [f"{k}={v}" for k, v in st.params.items()]
        for key, line, values in parse_overrides([*spec.overrides, *st.overrides, *stage_params]):
            _assign(fixed, swept, key, line, values)
        for key, line, values in user:
            in_some_stage = any(key in keys for keys in stage_keys)
            if values is None or key in st.params or (not in_some_stage and index == 0):
                _assign(fixed, swept, key, line, values)
        combos = list(itertools.product(*[[f"{k}={v}" for v in vals] for k, vals in swept.items()])) or [()]
        jobs = []
        for parent in _parents(st, spec, plans):
            for combo in combos:
                lines = list(combo)
                jobs.append(
                    Job(
                        stage=st.name,
                        action=st.action,
                        name=job_name(lines) if lines else DEFAULT_JOB,
                        swept=lines,
                        overrides=[*fixed.values(), *lines],
                        label=_label(st, lines, parent, fixed),
                        parent=None if parent is None else f"{parent.stage}/{parent.name}",
                    )
                )
        plans.append(StagePlan(stage=st, fixed=fixed, swept=swept, jobs=jobs))
    return plans


def _assign(fixed: dict[str, str], swept: dict[str, list[str]], key: str, line: str, values: list[str] | None) -> None:
    """A later override of a key replaces an earlier one, swept or not."""
    fixed.pop(key, None)
    swept.pop(key, None)
    if values is None:
        fixed[key] = line
    else:
        swept[key] = values


def _parents(st: StageSpec, spec: SweepSpec, plans: list[StagePlan]) -> list[Job | None]:
    if st.action != "extend":
        return [None]
    assert st.parent is not None
    stage_name, _, match = st.parent.partition("/")
    if not match:  # "pos=rope" alone means: in the first stage
        stage_name, match = spec.stages[0].name, stage_name
    earlier = {plan.stage.name: plan.jobs for plan in plans}
    if stage_name not in earlier:
        hint = suggest(stage_name, list(earlier))
        raise ConfigError(f"stage '{st.name}': parent stage '{stage_name}' is not an earlier stage{hint}")
    wanted = {p.strip() for p in match.split(",") if p.strip()}
    return [job for job in earlier[stage_name] if wanted <= set(job.overrides)]


def _label(st: StageSpec, lines: list[str], parent: Job | None, fixed: dict[str, str]) -> str:
    """Row label: the swept values (a scheme by its name alone), seeds left out so they can be averaged."""
    values = {line.split("=", 1)[0].lstrip("+~"): line.split("=", 1)[1] for line in [*fixed.values(), *lines]}
    seedless = [ln for ln in lines if not ln.split("=", 1)[0].endswith("seed")]
    if st.label:
        try:
            return st.label.format(parent=parent.label if parent else "", **_dotted(values))
        except (KeyError, IndexError) as e:
            raise ConfigError(f"stage '{st.name}': label template names unknown key {e}") from e
    parts = [ln.split("=", 1)[1] if ln.startswith("pos=") else ln.rsplit(".", 1)[-1] for ln in seedless]
    fallback = fixed["pos"].split("=", 1)[1] if "pos" in fixed and st.action == "train" else st.name
    own = ", ".join(parts) or fallback
    return own if parent is None else f"{parent.label} → {st.name} {own}"


def _dotted(values: dict[str, str]) -> dict[str, Any]:
    """`{"extend.factor": "4"}` -> usable as `{extend.factor}` in str.format (nested namespaces)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        head, *rest = key.split(".")
        if not rest:
            if not isinstance(out.get(head), _Namespace):
                out[head] = value
            continue
        node = out.setdefault(head, _Namespace())
        for part in rest[:-1]:
            if not isinstance(node, _Namespace):
                break
            node = node.__dict__.setdefault(part, _Namespace())
        if isinstance(node, _Namespace):  # else a group choice (model=tiny) shadows its keys: left out
            setattr(node, rest[-1], value)
    return out


class _Namespace:
    def __getattr__(self, name: str) -> str:  # a missing attribute in a label template reads as empty
        return ""


def validate_plan(plans: list[StagePlan], user_config_dir: Path | None) -> dict[str, Config]:
    """Compose and validate every job's config as its run will (`Config.validate`, and `run.train.check_budget`, the
    memory and step-time checks training makes before it allocates anything), so a bad override fails here, before
    anything runs (in a dry run too); returns each job's `Config` by `Job.key`."""
    configs: dict[str, Config] = {}
    for plan in plans:
        for job in plan.jobs:
            try:
                cfg = compose_config(job.overrides, user_config_dir)
                check_budget(cfg)  # as run.train.train does before allocating
            except ConfigError as e:
                raise ConfigError(f"job {job.stage}/{job.name}: {e}") from e
            configs[job.key] = cfg
    return configs


# ----------------------------------------------------------------------------------------------------------------
# A job's identity: the config it was planned with (see `sweep.identity`).


def plan_identities(plans: list[StagePlan], configs: dict[str, Config]) -> dict[str, dict[str, Any]]:
    """Each job's identity by `Job.key` (parents first, as stages come in order)."""
    identities: dict[str, dict[str, Any]] = {}
    for plan in plans:
        for job in plan.jobs:
            parent = identity_hash(identities[job.parent]) if job.parent in identities else None
            identities[job.key] = job_identity(configs[job.key], parent)
    return identities


def check_planned(sweep_dir: Path, plans: list[StagePlan], identities: dict[str, dict[str, Any]]) -> None:
    """Refuse (one line, before anything runs) a job whose directory holds a run planned with another config."""
    recorded = read_planned(sweep_dir)
    for job in (job for plan in plans for job in plan.jobs):
        job_dir = job.dir(sweep_dir)
        status = job_status(job_dir)
        if status == "pending" or (status == "failed" and not is_run_dir(job_dir)):  # nothing there to reuse
            continue
        entry = recorded.get(job.key)
        if isinstance(entry, dict):
            old = entry.get("config")
        else:  # a directory from before the record: a train job's own config.yaml
            old = run_config_identity(job_dir) if job.action == "train" else None
        if not isinstance(old, dict):
            continue
        new = identities[job.key]
        if identity_hash(old) != identity_hash(new):
            raise ConfigError(difference(job_dir, old, new))


# ----------------------------------------------------------------------------------------------------------------
# Running a sweep (parent process).


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
) -> list[StagePlan]:
    """Validate every job, then run each stage (one Hydra multirun per parent group); returns the plan.

    A job whose directory holds a run planned with another config is refused (`check_planned`). Done jobs
    (`job_status`) are skipped; others resume in their own directory. The sweep directory is locked for the whole
    run: a second sweep into it fails at once (`UserError`) and changes nothing. A job stopped by a signal ends the
    sweep with `SweepInterrupted` before any later job or stage starts.
    """
    launcher_overrides = launcher_overrides or []
    launcher_settings(launcher_overrides, user_config_dir)  # as the dry run checks them
    plans = plan_sweep(spec, user_overrides)
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
            f"+{INTERNAL_KEY}.sweep_dir={_hydra_quote(str(sweep_dir))}",
            f"+{INTERNAL_KEY}.session={session}",
        ]
        if parent is not None:
            parent_dir = sweep_dir / parent
            if job_status(parent_dir) != "done":
                for job in todo:
                    _record_failure(job.dir(sweep_dir), job.name, f"parent run {parent} did not finish")
                say("fail", f"{title}: parent run did not finish; {len(todo)} job(s) marked failed")
                continue
            internal.append(f"+{INTERNAL_KEY}.parent_dir={_hydra_quote(str(parent_dir))}")
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
        if stopped or session in _STOPPED:
            names = [j.key for j in stopped] or ["a job"]
            raise SweepInterrupted(names, _STOPPED.get(session))


def _hydra_quote(value: str) -> str:
    return quote_value(value)


def write_plan(
    spec: SweepSpec,
    user_overrides: list[str],
    sweep_dir: Path,
    plans: list[StagePlan],
    identities: dict[str, dict[str, Any]] | None = None,
) -> None:
    """`sweep.json`: what ran and how each job is labelled (and, given `identities`, the hash of the config each job
    was planned with, as `PLANNED_FILE` records it), so `compare` can rebuild the table from disk."""
    record = {
        "schema_version": 1,
        "sweep": spec.name,
        "file": str(spec.path),
        "overrides": user_overrides,
        "jobs": [
            {
                "stage": job.stage,
                "name": job.name,
                "dir": str(job.dir(sweep_dir).relative_to(sweep_dir)),
                "label": job.label,
                "parent": job.parent,
                "swept": job.swept,
                **({"config_hash": identity_hash(identities[job.key])} if identities and job.key in identities else {}),
            }
            for plan in plans
            for job in plan.jobs
        ],
    }
    atomic_write_json(sweep_dir / PLAN_FILE, record)


def read_plan(sweep_dir: Path) -> dict[str, Any] | None:
    path = Path(sweep_dir) / PLAN_FILE
    if not path.is_file():
        return None
    try:
        plan = json.loads(path.read_text())
    except ValueError as e:
        raise ConfigError(f"{path}: not valid JSON") from e
    return plan if isinstance(plan, dict) and "jobs" in plan else None


def _record_failure(job_dir: Path, name: str, message: str) -> None:
    atomic_write_json(job_dir / FAILED_FILE, {"error": message, "traceback": "", "job": name})


# ----------------------------------------------------------------------------------------------------------------
# The job function (runs in the launcher's process: locally, in a joblib worker or on a Slurm node).


_STOPPED: dict[str, int | None] = {}  # sweep sessions in which this process saw a job's training interrupted


def run_job(raw: dict[str, Any], info: JobInfo) -> dict[str, Any]:
    """Train or extend, then evaluate, then mark the job done; record a failure in the job directory instead of
    raising. A done job returns at once; a job whose training a signal stopped is not evaluated (status
    "interrupted"), nor finished when SIGTERM comes during its evaluation, and later jobs of the same sweep in this
    process do not start."""
    job = raw.pop(INTERNAL_KEY, {}) or {}
    job_dir = info.output_dir
    session = str(job.get("session", ""))
    if session in _STOPPED:
        return {"status": "interrupted", "dir": str(job_dir)}
    if job_status(job_dir) == "done":
        return {"status": "ok", "dir": str(job_dir)}
    started, profile = time.perf_counter(), JobProfile()
    print(f"== job {job_dir} ==", flush=True)  # the job's own log (a file under Slurm)
    (job_dir / FAILED_FILE).unlink(missing_ok=True)
    (job_dir / DONE_FILE).unlink(missing_ok=True)  # one of an earlier checkpoint
    fault = _Fault.from_env(job_dir)
    try:
        with sigterm_raises():  # outside training's own handler (data, evaluation) SIGTERM stops the job too
            cfg = config_from_dict(raw)
            if cfg.train.threads == 0 and info.parallel_jobs != 1:
                jobs = info.parallel_jobs if info.parallel_jobs > 0 else (os.cpu_count() or 1)
                cfg = replace(cfg, train=replace(cfg.train, threads=max(1, (os.cpu_count() or 1) // jobs)))
            sweep_dir = Path(job["sweep_dir"]) if job.get("sweep_dir") else None
            action = str(job.get("action", "train"))
            log = job_console(log_label(info, action, sweep_dir))
            if action == "train":
                finished = _train_job(cfg, job_dir, sweep_dir, profile, fault, log)
            else:
                finished = _extend_job(cfg, job_dir, Path(job["parent_dir"]), sweep_dir, profile, fault, log)
            if finished is not None:  # a signal stopped training (at its last step too): do not evaluate it
                _STOPPED[session] = finished
                return {"status": "interrupted", "dir": str(job_dir)}
            fault.hit("evaluate", 0)
            _evaluate_job(cfg, job_dir, profile, fault)
            write_job_profile(job_dir, profile, time.perf_counter() - started)  # informative; not a done marker
            _mark_done(job_dir, info.name)
            return {"status": "ok", "dir": str(job_dir)}
    except Stopped as e:  # cells already measured stay stored; a re-run measures the rest
        _STOPPED[session] = e.signum
        return {"status": "interrupted", "dir": str(job_dir)}
    except Exception as e:  # one failed job must not hide the others' results
        record = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(), "job": info.name}
        try:
            atomic_write_json(job_dir / FAILED_FILE, record)
        except OSError as write_error:  # e.g. a full disk: the reason still reaches the job's log
            print(f"job {job_dir} failed: {record['error']} (its {FAILED_FILE} could not be written: {write_error})",
                  file=sys.stderr, flush=True)  # fmt: skip
        return {"status": "failed", "dir": str(job_dir), "error": record["error"]}


def _job_display(cfg: Any, console: Console | None = None) -> Any:
    return TrainDisplay(console or Console(soft_wrap=True), live=False, log_every=cfg.train.log_every)


def _tracked(display: Any, cfg: Any, job_dir: Path, sweep_dir: Path | None) -> Any:
    """Each job is its own tracker run, grouped by its sweep."""
    if sweep_dir is None:
        return tracked(display, cfg, job_dir)
    return tracked(display, cfg, job_dir, group=sweep_dir.name, store=sweep_dir)


def _train_job(
    cfg: Any, job_dir: Path, sweep_dir: Path | None, profile: JobProfile, fault: _Fault, log: Console | None = None
) -> int | None:
    """Train (or resume) the job's run; None when training finished and no signal came, else the signal that stopped
    it (0: unknown) or that came at its last step."""
    seen = SignalSeen()
    with _job_display(cfg, log) as display, _tracked(display, cfg, job_dir, sweep_dir) as callback:
        recorder = TrainRecorder(profile, cfg, seen.wrap(fault.on_step(callback)))
        result = train(cfg, job_dir, resume=is_run_dir(job_dir), callback=recorder)
    return (result.signal or 0) if result.stopped_reason == "interrupted" else seen.signum


def _extend_job(
    cfg: Any,
    job_dir: Path,
    parent_dir: Path,
    sweep_dir: Path | None,
    profile: JobProfile,
    fault: _Fault,
    log: Console | None = None,
) -> int | None:
    """Extend (or resume the fine-tune of) the job's run; like `_train_job`, None when it finished."""
    seen = SignalSeen()
    with _job_display(cfg, log) as display, _tracked(display, cfg, job_dir, sweep_dir) as callback:
        booked, start = sum(profile.seconds.values()), time.perf_counter()
        recorder = TrainRecorder(profile, cfg, seen.wrap(fault.on_step(callback)))
        if cfg.extend.remap != "none":  # a training-free position remapping instead of a scaling
            ext = cfg.extend
            remap = RemapConfig(method=ext.remap, window=ext.remap_window, group=ext.remap_group, leaky=ext.remap_leaky)
            result: Any = remap_run(parent_dir, job_dir, remap, threads=cfg.train.threads, logn=ext.remap_logn)
        elif cfg.extend.longrope_search:  # LongRoPE: search the factors on the parent, then extend with them
            ext = cfg.extend  # as `extend --search`: search tokens recorded, factors file written, no re-search
            result, found = extend_with_search(
                parent_dir,
                job_dir,
                ext,
                budget=ext.longrope_search,
                seed=ext.longrope_search_seed,
                threads=cfg.train.threads,
                callback=recorder,
            )
            profile.add("longrope search", found.seconds if found is not None else 0.0)
        else:
            result = extend_run(parent_dir, job_dir, cfg.extend, threads=cfg.train.threads, callback=recorder)
        fine_tune = sum(profile.seconds.values()) - booked  # its setup, steps, validation and saves
        profile.add("extend", time.perf_counter() - start - fine_tune)
    return (getattr(result, "signal", None) or 0) if result.status == "interrupted" else seen.signum


def _evaluate_job(cfg: Any, job_dir: Path, profile: JobProfile | None = None, fault: _Fault | None = None) -> None:
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
            progress = recorder if fault is None else fault.on_progress(recorder)
            result = task.evaluate_job(run, cfg, device=device, progress=progress)
            entries = result.get("entries") or []
            recorder.book_flops(entries)
            eval_facts(profile, entries, device)
        return result

    evaluate_each_run([job_dir], evaluate, device=cfg.train.device, threads=cfg.train.threads)


def _mark_done(job_dir: Path, name: str) -> None:
    """Write the job's done marker (last, atomically), naming the checkpoint its results measured."""
    meta = read_run_meta(job_dir)
    if meta.status != "complete":  # training must have finished; never mark a half-trained run done
        raise RuntimeError(f"{job_dir}: training status is {meta.status!r}, not 'complete'")
    record = {"job": name, "checkpoint": checkpoint_identity(meta)}
    atomic_write_json(job_dir / DONE_FILE, record)


def job_status(job_dir: Path) -> str:
    """The one definition of a job's state, from disk.

    'done': its marker exists and names the run's current checkpoint (training complete, every cell evaluated);
    'failed': failed.json; 'interrupted': a signal stopped its training (a re-run resumes it); 'partial': started
    but not done (killed, or stopped during evaluation: a re-run finishes it); 'pending': not started.
    """
    job_dir = Path(job_dir)
    try:
        meta: RunMeta | None = read_run_meta(job_dir)
    except (CheckpointError, OSError):
        meta = None
    try:
        marker = json.loads((job_dir / DONE_FILE).read_text())
    except (OSError, ValueError):
        marker = None
    if meta is not None and isinstance(marker, dict) and marker.get("checkpoint") == checkpoint_identity(meta):
        return "done"
    if (job_dir / FAILED_FILE).is_file():
        return "failed"
    if meta is not None and meta.status == "interrupted":
        return "interrupted"
    return "partial" if job_dir.is_dir() and any(job_dir.iterdir()) else "pending"


class _Fault:
    """Test hook: `POSENC_DEBUG_SWEEP_FAULT=PHASE:N:SIGNAL[:JOB]` sends SIGNAL (TERM, INT, KILL) to this process.

    PHASE `train` fires after the N-th training (or fine-tuning) step, `evaluate` just before the evaluation starts
    (N = 0), `eval` at the N-th progress report of the evaluation (mid-cell); JOB, when given, must occur in the job
    directory's path. Used by the fault tests to stop a sweep at a chosen moment.
    """

    def __init__(self, phase: str = "", at: int = -1, signum: int = 0) -> None:
        self.phase, self.at, self.signum = phase, at, signum
        self.count = 0

    @classmethod
    def from_env(cls, job_dir: Path) -> _Fault:
        spec = os.environ.get(FAULT_ENV, "")
        if not spec:
            return cls()
        phase, at, name, *job = spec.split(":", 3)
        if job and job[0] not in Path(job_dir).as_posix():
            return cls()
        return cls(phase, int(at), int(signal.Signals[f"SIG{name}"]))

    def hit(self, phase: str, n: int) -> None:
        if self.signum and phase == self.phase and n == self.at:
            os.kill(os.getpid(), self.signum)

    def on_step(self, callback: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
        def wrapped(event: dict[str, Any]) -> None:
            callback(event)
            if event.get("event") == "step":
                self.hit("train", int(event["step"]))

        return wrapped

    def on_progress(self, progress: Callable[[str, int, int], None]) -> Callable[[str, int, int], None]:
        def wrapped(what: str, done: int, total: int) -> None:
            progress(what, done, total)
            self.count += 1
            self.hit("eval", self.count)

        return wrapped


def read_failure(job_dir: Path) -> str:
    try:
        return str(json.loads((job_dir / FAILED_FILE).read_text()).get("error", "unknown error"))
    except (OSError, ValueError):
        return "unknown error"
