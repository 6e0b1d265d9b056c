"""Planning a sweep: its stages expanded into jobs, each job's config validated and its identity checked against
what the sweep directory already holds; `sweep.json` records the plan.

Job directories are `<sweep dir>/<stage>/<swept key=value,...>/`, so a job's identity is stable across re-runs and a
re-run skips or resumes each job in place.

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

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc_cli.config import Config, suggest
from posenc_cli.errors import ConfigError
from posenc_cli.fsutil import atomic_write_json
from posenc_cli.run.compile import check_compile
from posenc_cli.run.device import resolve_device
from posenc_cli.run.drope import check_drope
from posenc_cli.run.meta import is_run_dir
from posenc_cli.run.train import check_budget
from posenc_cli.sweep.hydra_bridge import compose_config, job_name, parse_overrides
from posenc_cli.sweep.identity import (
    difference,
    identity_hash,
    job_identity,
    numbers_keys,
    read_planned,
    run_config_identity,
)
from posenc_cli.sweep.markers import job_status
from posenc_cli.sweep.spec import StageSpec, SweepSpec

PLAN_FILE = "sweep.json"
DEFAULT_JOB = "default"  # the directory of the one job of a stage that sweeps nothing


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
                check_drope(cfg)  # a train.drope_at that could not do what it says
                if cfg.train.compile and cfg.train.device in ("auto", "cpu"):  # a missing compiler fails here
                    check_compile(cfg.train.compile, resolve_device(cfg.train.device))  # (a cuda job: at its run)
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
        old = numbers_keys(old)  # nested scalings, without runtime keys (train.compile was one before it was listed)
        new = identities[job.key]
        if identity_hash(old) != identity_hash(new):
            raise ConfigError(difference(job_dir, old, new))


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
