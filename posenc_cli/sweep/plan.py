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

A train stage with `after: <select stage>` depends on that stage's pick (`sweep.select`): until the pick is known its
jobs are planned without it (`StagePlan.awaiting`, validated but without a directory), and with `picks` each job runs
with its group's picked overrides, in `<sweep dir>/<stage>/<picked key=value,...>/<swept key=value,...>/`. The pick
is thus part of a later job's directory and identity: a changed pick plans new jobs (run beside the old ones), never
reuses results of another setting. With `learned_only: true` (a select stage picking by competence), a group whose
pick did not pass the competence gate gets no jobs (`StagePlan.left_out`): seeds only for the rows that learned;
`not_learned_only: true` the reverse: more steps only for the rows still below the gate. With `gate_by: <stage>` as
well, each job is gated by its own run of that earlier stage (the same group, and the values of the keys that stage
sweeps), so the stage waits for that stage's runs (`StagePlan.awaiting_runs`); the verdicts come from
`sweep.gating.read_gates`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc_cli.config import Config, suggest
from posenc_cli.errors import ConfigError
from posenc_cli.fsutil import atomic_write_json
from posenc_cli.report.gate import DEFAULT_COMPETENCE
from posenc_cli.run.compile import check_compile
from posenc_cli.run.config_compose import compose_config
from posenc_cli.run.device import resolve_device
from posenc_cli.run.drope import check_drope
from posenc_cli.run.meta import is_run_dir
from posenc_cli.run.train import check_budget
from posenc_cli.sweep.gating import RunGate
from posenc_cli.sweep.hydra_bridge import job_name, parse_overrides
from posenc_cli.sweep.identity import (
    difference,
    identity_hash,
    job_identity,
    numbers_keys,
    read_planned,
    run_config_identity,
)
from posenc_cli.sweep.markers import job_status
from posenc_cli.sweep.select import Pick, group_of, group_text, line_value, override_key
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
    after: str | None = None  # the select stage whose pick this job runs with
    picked: list[str] | None = None  # that pick's override lines for the job's group (None: not made yet)
    gated_by: str | None = None  # a `gate_by` stage's job before its gate's runs ran: whether it runs is not known

    @property
    def resolved(self) -> bool:
        """False for a job that awaits its select stage's pick (it has no directory yet), or the runs of the stage
        that decide whether it runs (it is planned, validated and shown, but neither recorded nor run yet)."""
        return (self.after is None or self.picked is not None) and self.gated_by is None

    def dir(self, sweep_dir: Path) -> Path:
        if self.after is not None:
            if self.picked is None:
                raise RuntimeError(f"job {self.stage}/{self.name} awaits the pick of stage {self.after}")
            return stage_dir(sweep_dir, self.stage, job_name(self.picked) if self.picked else DEFAULT_JOB) / self.name
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
    """A stage expanded: its fixed and swept overrides, and its jobs (one group per parent run). `awaiting`: the
    select stage whose pick the stage's jobs need and that is not made yet (their directories are unknown)."""

    stage: StageSpec
    fixed: dict[str, str]
    swept: dict[str, list[str]]
    jobs: list[Job]
    awaiting: str | None = None
    awaiting_runs: str | None = None  # a `gate_by` stage's: the stage whose runs' verdicts it needs and lacks
    picked_keys: list[str] = field(default_factory=list)  # an `after` stage's: the keys its select stage picks
    group_by: tuple[str, ...] = ()  # an `after` stage's: its select stage's group keys
    left_out: dict[str, RunGate] = field(default_factory=dict)  # a `runs_for` stage's groups (or runs) left out

    @property
    def waits(self) -> bool:
        """True while its jobs are not all known: a pick or (`gate_by`) an earlier stage's runs are not there yet."""
        return self.awaiting is not None or self.awaiting_runs is not None

    @property
    def chosen(self) -> list[str]:
        """A select stage's keys that its pick sets: its swept keys other than `group_by`'s (none for other stages)."""
        rule = self.stage.select
        return [] if rule is None else [k for k in self.swept if k not in rule.group_by]


def plan_sweep(
    spec: SweepSpec,
    user_overrides: list[str],
    picks: Mapping[str, Pick] | None = None,
    *,
    gate: float = DEFAULT_COMPETENCE,
    gates: Mapping[str, RunGate] | None = None,
) -> list[StagePlan]:
    """Expand every stage into its jobs: the cartesian product of swept values, as Hydra's basic sweeper does.

    Precedence: sweep-file globals < stage overrides < stage params < the user's command-line overrides. A user's
    comma list sweeps the stages whose params name that key (or the first stage if none does); one value of a key a
    stage sweeps narrows that sweep to it (`pos=rope`: job `train/pos=rope`, as in the full grid, not `default`). A
    stage `after` a select stage runs once per group of it (the group keys the stage does not set itself are the
    select stage's), each job with its group's pick from `picks` (by select stage name); without one, the stage
    `awaiting` it. A `learned_only` / `not_learned_only` stage keeps the jobs whose pick (or, with `gate_by`, own run
    of that stage) learned / did not: `gates` holds the verdicts by run (`sweep.gating.read_gates`); a pick without
    one is judged by its value against `gate` (>=); a `gate_by` stage lacking one awaits that stage's runs.
    """
    picks = picks or {}
    gates = gates or {}
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
            if values is None and key in swept:  # one value of a swept key: still swept, so its job keeps the name
                values = [line.split("=", 1)[1]]
            if values is None or key in st.params or (not in_some_stage and index == 0):
                _assign(fixed, swept, key, line, values)
        if st.action == "select":
            _check_select(st, swept)
        select = _select_plan(st, plans)
        if select is not None:
            swept = _after_select(st, fixed, swept, select)
        combos = list(itertools.product(*[[f"{k}={v}" for v in vals] for k, vals in swept.items()])) or [()]
        jobs = []
        parents, awaiting, parent_runs = _parents(st, spec, plans)
        if select is not None and st.after not in picks:
            awaiting = st.after
        for parent in parents:
            for combo in combos:
                lines = list(combo)
                job = Job(
                    stage=st.name,
                    action=st.action,
                    name=job_name(lines) if lines else DEFAULT_JOB,
                    swept=lines,
                    overrides=[*fixed.values(), *lines],
                    label=_label(st, lines, parent, fixed),
                    parent=None if parent is None else _parent_key(parent),
                )
                if select is not None:
                    _with_pick(job, select, picks.get(select.stage.name))
                jobs.append(job)
        left_out: dict[str, RunGate] = {}
        awaiting_runs = parent_runs
        follows = _own_runs(st, jobs, plans) if st.gate_by is not None else {}
        if select is not None and st.runs_for is not None and st.after in picks:
            learned = st.runs_for == "learned"
            if st.gate_by is None:
                jobs, left_out = _gated_by_pick(jobs, picks[st.after], gates, gate, learned=learned)
            elif all(follows[job.name].key in gates for job in jobs):
                jobs, left_out = _gated_by_run(jobs, follows, gates, learned=learned)
            else:
                awaiting_runs = st.gate_by
                for job in jobs:
                    job.gated_by = st.gate_by
        chosen = select.chosen if select is not None else []
        group_by = select.stage.select.group_by if select is not None and select.stage.select is not None else ()
        plans.append(
            StagePlan(
                stage=st,
                fixed=fixed,
                swept=swept,
                jobs=jobs,
                awaiting=awaiting,
                awaiting_runs=awaiting_runs,
                picked_keys=chosen,
                group_by=group_by,
                left_out=left_out,
            )
        )
    return plans


def _gated_by_pick(
    jobs: list[Job], pick: Pick, gates: Mapping[str, RunGate], gate: float, *, learned: bool
) -> tuple[list[Job], dict[str, RunGate]]:
    """The jobs of a `runs_for` stage whose group's picked run learned (when `learned`; else did not), and each group
    left out with the verdict on its pick (`gates`', else its value against `gate`)."""
    kept, left_out = [], {}
    for job in jobs:
        group = group_of(job.overrides, pick.rule.group_by)
        point = pick.chosen_points[group]
        verdict = gates.get(point.run) or RunGate.of_value(point.value, gate)
        if verdict.learned == learned:
            kept.append(job)
        else:
            left_out[group_text(pick.rule.group_by, group)] = verdict
    return kept, left_out


def _own_runs(st: StageSpec, jobs: list[Job], plans: list[StagePlan]) -> dict[str, Job]:
    """Each job of `gate_by` stage `st` by name -> its own run of that stage: the same group and the same value of
    every key that stage sweeps besides; a job with none is refused, in one line."""
    source = next(plan for plan in plans if plan.stage.name == st.gate_by)
    keys = [k for k in source.swept if k not in source.group_by]
    runs = {(group_of(j.overrides, source.group_by), group_of(j.overrides, keys)): j for j in source.jobs}
    out = {}
    for job in jobs:
        found = runs.get((group_of(job.overrides, source.group_by), group_of(job.overrides, keys)))
        if found is None:
            given = " ".join(f"{k}={','.join(v)}" for k, v in source.swept.items() if k not in source.group_by)
            raise ConfigError(
                f"stage '{st.name}': job {job.name} has no run of stage {source.stage.name} to be gated by (that "
                f"stage sweeps {given or 'nothing but its groups'}; give each job one of those values)"
            )
        out[job.name] = found
    return out


def _gated_by_run(
    jobs: list[Job], follows: dict[str, Job], gates: Mapping[str, RunGate], *, learned: bool
) -> tuple[list[Job], dict[str, RunGate]]:
    """The jobs of a `gate_by` stage whose own run learned (when `learned`; else did not), and each run left out
    (its group and swept values, 'pos=rope train.seed=1') with its verdict."""
    kept, left_out = [], {}
    for job in jobs:
        run = follows[job.name]
        verdict = gates[run.key]
        if verdict.learned == learned:
            kept.append(job)
        else:
            left_out[" ".join(run.swept)] = verdict
    return kept, left_out


def _parent_key(parent: Job) -> str:
    """How a job names its parent run: the parent's stage and name (its key, where a pick adds a directory level)."""
    return parent.key if parent.after is not None else f"{parent.stage}/{parent.name}"


def _check_select(st: StageSpec, swept: dict[str, list[str]]) -> None:
    """A select stage trains its grid on one seed, the one the file names."""
    seeds = [key for key in swept if key.endswith("seed")]
    if seeds:
        raise ConfigError(
            f"stage '{st.name}': a select stage trains its grid on one seed; {seeds[0]} is swept "
            f"({','.join(swept[seeds[0]])}): give it one value, and sweep seeds in a stage with after: {st.name}"
        )


def _select_plan(st: StageSpec, plans: list[StagePlan]) -> StagePlan | None:
    """The plan of the select stage that `st` runs after (None for a stage without `after`)."""
    if st.after is None:
        return None
    found = next((plan for plan in plans if plan.stage.name == st.after and plan.stage.select is not None), None)
    if found is None:
        raise ConfigError(f"stage '{st.name}': after: '{st.after}' is not an earlier select stage")
    return found


def _after_select(
    st: StageSpec, fixed: dict[str, str], swept: dict[str, list[str]], select: StagePlan
) -> dict[str, list[str]]:
    """An `after` stage's overrides: the keys the pick sets are left to the pick (the sweep's globals give them to
    the select stage's grid; the stage itself may not set them), and the group keys it does not set itself are the
    select stage's (fixed or swept as there). Returns its swept keys, the inherited group keys first."""
    assert select.stage.select is not None
    own = {override_key(line) for line in [*st.overrides, *(f"{k}={v}" for k, v in st.params.items())]}
    for key in select.chosen:
        if key in own:
            raise ConfigError(
                f"stage '{st.name}': {key} is chosen by stage {select.stage.name}'s pick; a stage with "
                f"after: {select.stage.name} cannot set it"
            )
        fixed.pop(key, None)
        swept.pop(key, None)
    inherited: dict[str, list[str]] = {}
    for key in select.stage.select.group_by:
        if key in fixed or key in swept:
            continue
        if key in select.fixed:
            fixed[key] = select.fixed[key]
        elif key in select.swept:
            inherited[key] = select.swept[key]
    return {**inherited, **swept}


def _with_pick(job: Job, select: StagePlan, pick: Pick | None) -> None:
    """Give `job` its group's picked overrides (or mark it awaiting); a group the select stage has no grid for is
    refused."""
    assert select.stage.select is not None
    group_by = select.stage.select.group_by
    group = group_of(job.overrides, group_by)
    groups = {group_of(j.overrides, group_by) for j in select.jobs}
    if group not in groups:
        trained = sorted({line_value(j.overrides, k) or "(default)" for j in select.jobs for k in group_by[:1]})
        raise ConfigError(
            f"stage '{job.stage}': job {job.name} ({group_text(group_by, group)}) has no grid in stage "
            f"{select.stage.name} to pick from (its {group_by[0] if group_by else 'grid'}: {', '.join(trained)})"
        )
    job.after = select.stage.name
    if pick is not None:
        job.picked = pick.lines(group)
        picked_keys = {override_key(line) for line in job.picked}
        job.overrides = [o for o in job.overrides if override_key(o) not in picked_keys] + job.picked


def _assign(fixed: dict[str, str], swept: dict[str, list[str]], key: str, line: str, values: list[str] | None) -> None:
    """A later override of a key replaces an earlier one, swept or not."""
    fixed.pop(key, None)
    swept.pop(key, None)
    if values is None:
        fixed[key] = line
    else:
        swept[key] = values


def _parents(st: StageSpec, spec: SweepSpec, plans: list[StagePlan]) -> tuple[list[Job | None], str | None, str | None]:
    """The runs an extend stage derives from ([None] for other stages), and what they await (None if nothing): the
    pick of a select stage, or the runs of the stage that gates theirs (`gate_by`)."""
    if st.action != "extend":
        return [None], None, None
    assert st.parent is not None
    stage_name, _, match = st.parent.partition("/")
    if not match:  # "pos=rope" alone means: in the first stage
        stage_name, match = spec.stages[0].name, stage_name
    earlier = {plan.stage.name: plan.jobs for plan in plans}
    if stage_name not in earlier:
        hint = suggest(stage_name, list(earlier))
        raise ConfigError(f"stage '{st.name}': parent stage '{stage_name}' is not an earlier stage{hint}")
    wanted = {p.strip() for p in match.split(",") if p.strip()}
    source = next(plan for plan in plans if plan.stage.name == stage_name)
    if source.waits:  # the parent runs' directories depend on a pick not made yet, or are not all known
        return [], source.awaiting, source.awaiting_runs
    return [job for job in earlier[stage_name] if wanted <= set(job.overrides)], None, None


def _label(st: StageSpec, lines: list[str], parent: Job | None, fixed: dict[str, str]) -> str:
    """Row label: the swept values (a scheme by its name alone), seeds left out so they can be averaged."""
    values = {line.split("=", 1)[0].lstrip("+~"): line.split("=", 1)[1] for line in [*fixed.values(), *lines]}
    seedless = [ln for ln in lines if not ln.split("=", 1)[0].endswith("seed")]
    if st.label:
        try:
            return st.label.format(parent=parent.label if parent else "", **_dotted(values))
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(f"stage '{st.name}': label template {st.label!r}: {e}") from e
    parts = [ln.split("=", 1)[1] if ln.startswith("pos=") else _short(ln) for ln in seedless]
    fallback = fixed["pos"].split("=", 1)[1] if "pos" in fixed and st.action != "extend" else st.name
    own = ", ".join(parts) or fallback
    return own if parent is None else f"{parent.label} → {st.name} {own}"


def _short(line: str) -> str:
    """'train.lr=0.001' -> 'lr=0.001' (the key's last part; a value's own dots kept)."""
    key, _, value = line.partition("=")
    return f"{key.rsplit('.', 1)[-1]}={value}"


def _dotted(values: dict[str, str]) -> dict[str, Any]:
    """`{"extend.factor": "4"}` -> usable as `{extend.factor}` in str.format (nested namespaces); a key that is both
    a value and a parent (`train=quick`, `train.lr=0.001`) gives both: `{train}` reads `quick`, `{train.lr}` `0.001`."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        head, *rest = key.split(".")
        node = out.setdefault(head, _Namespace())
        for part in rest:
            node = node.__dict__.setdefault(part, _Namespace())
        node.choice = value
    return out


class _Namespace:
    """A template's dotted lookup: missing attributes read as empty; formatted alone, the group's choice."""

    choice = ""

    def __getattr__(self, name: str) -> str:  # a missing attribute in a label template reads as empty
        return ""

    def __format__(self, spec: str) -> str:
        return format(self.choice, spec)


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
            if job.resolved:  # a job awaiting a pick is checked without it; its pick's values were checked in the grid
                configs[job.key] = cfg
    return configs


# ----------------------------------------------------------------------------------------------------------------
# A job's identity: the config it was planned with (see `sweep.identity`).


def plan_identities(plans: list[StagePlan], configs: dict[str, Config]) -> dict[str, dict[str, Any]]:
    """Each job's identity by `Job.key` (parents first, as stages come in order)."""
    identities: dict[str, dict[str, Any]] = {}
    for plan in plans:
        for job in (job for job in plan.jobs if job.resolved):
            parent = identity_hash(identities[job.parent]) if job.parent in identities else None
            identities[job.key] = job_identity(configs[job.key], parent)
    return identities


def check_planned(sweep_dir: Path, plans: list[StagePlan], identities: dict[str, dict[str, Any]]) -> None:
    """Refuse (one line, before anything runs) a job whose directory holds a run planned with another config."""
    recorded = read_planned(sweep_dir)
    for job in (job for plan in plans for job in plan.jobs if job.resolved):
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
                **({"after": job.after, "picked": job.picked} if job.after is not None else {}),
                **({"config_hash": identity_hash(identities[job.key])} if identities and job.key in identities else {}),
            }
            for plan in plans
            for job in plan.jobs
            if job.resolved  # a job awaiting a pick has no directory yet
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
