"""A select stage's pick: each group's best grid point by an in-distribution metric, recorded in the sweep directory.

McGill-NLP/length-generalization (`configs/sweeps/training_scratch.jsonnet`) trains a grid of learning rate ×
weight decay per scheme and task on one seed, keeps the best by in-distribution validation accuracy, then trains
seeds with each scheme's pick. A `select` stage is that grid: its jobs train and evaluate as train jobs do, and
`make_pick` reads one number per finished job (`val_loss`: the final validation loss on the held-apart split, from
the run's meta.json, minimised; `competence`: in-distribution task accuracy from `evaluation.competence`,
maximised) and picks, per group of `group_by` values (default: each scheme on its own), the setting of the swept keys
other than the group's (`Pick.chosen`). Competence ties (several points at 100%, or every point at 0% when none
learned) go to the lower final validation loss; remaining ties to the grid point that comes first in the grid's
order (the order of the file's params and of each key's values, as Hydra's basic sweeper expands them); a non-finite
value (a diverged run) ranks below every finite one and is never picked. A group with an unfinished or failed point
is not picked (`SelectionPending`) unless the stage says `partial: true`, which picks among its finished points.

`write_pick` records the pick in `<sweep dir>/<stage>/pick.json` (atomically), with every grid point's value, status
and run directory; the sweep recomputes it from disk each time it runs, so a re-run after more points finished (or
new grid values) picks again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from posenc_cli.errors import CheckpointError, ConfigError, UserError
from posenc_cli.fsutil import atomic_write_json
from posenc_cli.run.meta import read_run_meta
from posenc_cli.sweep.markers import job_status
from posenc_cli.sweep.spec import SelectSpec

PICK_FILE = "pick.json"  # in a select stage's directory
METRIC_GOALS = {"val_loss": "min", "competence": "max"}
TIE_BREAK = "the first grid point in the grid's order (the file's params, each key's values in order)"
COMPETENCE_TIE_BREAK = f"the lower final val_loss, then {TIE_BREAK}"

Reader = Callable[[Path], float | None]  # a finished job's directory -> its metric (None: not measured)
GroupKey = tuple[str | None, ...]  # the values of `group_by` keys, None for a key the job does not set


class SelectionPending(UserError):
    """A select stage cannot pick yet: grid points of some group have not finished (or failed)."""


class GridJob(Protocol):
    """What a pick needs of a planned job (`sweep.plan.Job`)."""

    @property
    def key(self) -> str: ...

    swept: list[str]
    overrides: list[str]

    def dir(self, sweep_dir: Path) -> Path: ...


def override_key(line: str) -> str:
    """'+train.lr=0.1' -> 'train.lr'."""
    return line.split("=", 1)[0].lstrip("+~")


def line_value(lines: Sequence[str], key: str) -> str | None:
    """The value the last of `lines` gives `key` (None if none does)."""
    value = None
    for line in lines:
        if "=" in line and override_key(line) == key:
            value = line.split("=", 1)[1]
    return value


def group_of(lines: Sequence[str], group_by: Sequence[str]) -> GroupKey:
    return tuple(line_value(lines, key) for key in group_by)


def group_text(group_by: Sequence[str], group: GroupKey) -> str:
    """'pos=rope' ('pos=rope data.task=copy'; 'all runs' for an empty group_by)."""
    parts = [f"{key}={'(default)' if value is None else value}" for key, value in zip(group_by, group, strict=True)]
    return " ".join(parts) or "all runs"


@dataclass(frozen=True, kw_only=True)
class GridPoint:
    """One job of the grid: its run (job key), group, the setting it tries (`key=value` lines of the chosen keys),
    its status (`markers.job_status`) and metric value (None when not finished or not measured)."""

    run: str
    group: GroupKey
    setting: tuple[str, ...]
    status: str
    value: float | None
    tiebreak: float | None = None  # compared (lower first) between points of equal value: competence's val_loss

    @property
    def usable(self) -> bool:
        return self.status == "done" and self.value is not None


@dataclass(frozen=True, kw_only=True)
class Pick:
    """A select stage's pick: per group, the grid point chosen (`chosen_points`), among `points` (all of them)."""

    stage: str
    rule: SelectSpec
    chosen: tuple[str, ...]  # the keys the pick sets (the grid's swept keys other than the group's)
    points: tuple[GridPoint, ...]
    chosen_points: dict[GroupKey, GridPoint]

    @property
    def goal(self) -> str:
        return METRIC_GOALS[self.rule.metric]

    def lines(self, group: GroupKey) -> list[str]:
        """The override lines a group's later jobs run with."""
        return list(self.chosen_points[group].setting)

    def to_json(self) -> dict[str, Any]:
        groups = []
        for group, best in self.chosen_points.items():
            points = [p for p in self.points if p.group == group]
            groups.append(
                {
                    "group": dict(zip(self.rule.group_by, group, strict=True)),
                    "picked": _setting_dict(best.setting),
                    "run": best.run,
                    "value": best.value,
                    "points": [
                        {"run": p.run, "setting": _setting_dict(p.setting), "status": p.status, "value": _finite(p)}
                        | ({"note": "non-finite"} if p.value is not None and not math.isfinite(p.value) else {})
                        for p in points
                    ],
                }
            )
        return {
            "schema_version": 1,
            "stage": self.stage,
            "metric": self.rule.metric,
            "goal": self.goal,
            **({"task": self.rule.task, "scoring": self.rule.scoring} if self.rule.metric == "competence" else {}),
            "group_by": list(self.rule.group_by),
            "chosen": list(self.chosen),
            "partial": self.rule.partial,
            "tie_break": COMPETENCE_TIE_BREAK if self.rule.metric == "competence" else TIE_BREAK,
            "groups": groups,
        }


def _setting_dict(lines: Sequence[str]) -> dict[str, str]:
    return {override_key(line): line.split("=", 1)[1] for line in lines}


def _finite(point: GridPoint) -> float | None:
    return point.value if point.value is not None and math.isfinite(point.value) else None


# ----------------------------------------------------------------------------------------------------------------
# Metrics


def read_val_loss(job_dir: Path) -> float | None:
    """The run's final validation loss (meta.json's `val_loss`: mean next-token loss over the fixed windows of the
    held-apart validation split, `run.validation`), None if it has none."""
    try:
        value = read_run_meta(job_dir).record.get("val_loss")
    except (CheckpointError, OSError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def metric_reader(rule: SelectSpec) -> Reader:
    """The reader of `rule.metric` for a finished job's directory."""
    if rule.metric == "val_loss":
        return read_val_loss
    try:
        from posenc_cli.evaluation.competence import competence  # deferred: the task registries
    except ImportError as e:
        raise ConfigError(
            "select.metric competence needs posenc_cli.evaluation.competence, which this posenc lacks; "
            "use select.metric val_loss"
        ) from e
    task, scoring = str(rule.task), rule.scoring
    return lambda job_dir: competence(job_dir, task, scoring)


# ----------------------------------------------------------------------------------------------------------------
# The pick


def grid_points(
    jobs: Sequence[GridJob],
    chosen: Sequence[str],
    group_by: Sequence[str],
    sweep_dir: Path,
    read: Reader,
    tiebreak: Reader | None = None,
) -> list[GridPoint]:
    """Every job of the grid, in the grid's order, with its status and (when done) its metric and, given `tiebreak`,
    the value that orders points of equal metric (lower first)."""
    points = []
    for job in jobs:
        job_dir = job.dir(sweep_dir)
        status = job_status(job_dir)
        value = read(job_dir) if status == "done" else None
        second = tiebreak(job_dir) if tiebreak is not None and status == "done" else None
        setting = tuple(line for line in job.swept if override_key(line) in chosen)
        points.append(
            GridPoint(
                run=job.key,
                group=group_of(job.overrides, group_by),
                setting=setting,
                status=status,
                value=value,
                tiebreak=second,
            )
        )
    return points


def choose(
    points: Sequence[GridPoint],
    goal: str,
    *,
    partial: bool,
    stage: str,
    metric: str,
    group_by: Sequence[str] = (),
) -> dict[GroupKey, GridPoint]:
    """Each group's best point (`goal` "min" or "max"; ties to the lower finite `tiebreak`, then the earliest
    point; non-finite values last).

    Refuses (`SelectionPending`, one line naming what is missing) a grid with an unfinished point unless `partial`,
    and a group with no finished, finite point at all."""
    groups: dict[GroupKey, list[tuple[int, GridPoint]]] = {}
    for index, point in enumerate(points):
        groups.setdefault(point.group, []).append((index, point))
    missing = [p for p in points if not p.usable]
    if missing and not partial:
        raise SelectionPending(
            f"stage {stage} cannot pick yet: {len(missing)} of {len(points)} grid points have no {metric} "
            f"({_missing_text(missing)}); run the sweep again to finish them, or set select.partial: true to pick "
            "among the finished ones"
        )
    sign = 1.0 if goal == "min" else -1.0
    best: dict[GroupKey, GridPoint] = {}
    for group, members in groups.items():
        usable = [(i, p) for i, p in members if p.value is not None and p.usable and math.isfinite(p.value)]
        if not usable:
            raise SelectionPending(
                f"stage {stage} cannot pick for {group_text(group_by, group)}: no grid point finished with a finite "
                f"{metric} ({_missing_text([p for _, p in members])})"
            )
        best[group] = min(usable, key=lambda item: (sign * float(item[1].value or 0.0), _second(item[1]), item[0]))[1]
    return best


def _second(point: GridPoint) -> float:
    """The tie-break value of a point, +inf when it has none (or a non-finite one)."""
    t = point.tiebreak
    return t if t is not None and math.isfinite(t) else math.inf


def _missing_text(points: Sequence[GridPoint], at_most: int = 3) -> str:
    def why(p: GridPoint) -> str:
        if p.status == "done":
            return "not measured" if p.value is None else "non-finite"
        return {"pending": "not run"}.get(p.status, p.status)

    shown = [f"{p.run}: {why(p)}" for p in points[:at_most]]
    more = f"; {len(points) - at_most} more" if len(points) > at_most else ""
    return "; ".join(shown) + more


def make_pick(
    stage: str,
    rule: SelectSpec,
    jobs: Sequence[GridJob],
    chosen: Sequence[str],
    sweep_dir: Path,
    read: Reader | None = None,
) -> Pick:
    """The pick of select stage `stage` from its jobs' directories (`read`: the metric reader, `metric_reader(rule)`
    unless given); `SelectionPending` when it cannot pick (see `choose`)."""
    read = read if read is not None else metric_reader(rule)
    tiebreak = read_val_loss if rule.metric == "competence" else None  # accuracy ties often: 100% or 0% everywhere
    points = grid_points(jobs, chosen, rule.group_by, Path(sweep_dir), read, tiebreak)
    goal = METRIC_GOALS[rule.metric]
    best = choose(points, goal, partial=rule.partial, stage=stage, metric=rule.metric, group_by=rule.group_by)
    return Pick(stage=stage, rule=rule, chosen=tuple(chosen), points=tuple(points), chosen_points=best)


def pick_path(sweep_dir: Path, stage: str) -> Path:
    return Path(sweep_dir) / stage / PICK_FILE


def write_pick(sweep_dir: Path, pick: Pick) -> Path:
    """Record `pick` in `<sweep dir>/<stage>/pick.json` (atomically); returns the path."""
    path = pick_path(sweep_dir, pick.stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, pick.to_json())
    return path


def read_pick(sweep_dir: Path, stage: str) -> dict[str, Any] | None:
    """A select stage's recorded pick (None when there is none, or it cannot be read)."""
    path = pick_path(sweep_dir, stage)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("groups"), list) else None


def pick_summary(doc: dict[str, Any]) -> list[str]:
    """One line per group of a recorded pick: 'pos=rope: train.lr=0.003 train.weight_decay=0.1 (val_loss 1.2345,
    best of 6)'."""
    lines = []
    metric = doc.get("metric", "?")
    for entry in doc.get("groups", []):
        group = " ".join(f"{k}={'(default)' if v is None else v}" for k, v in (entry.get("group") or {}).items())
        picked = " ".join(f"{k}={v}" for k, v in (entry.get("picked") or {}).items()) or "(nothing to choose)"
        value = entry.get("value")
        shown = f"{value:.4g}" if isinstance(value, (int, float)) else "n/a"
        points = entry.get("points") or []
        finished = sum(1 for p in points if p.get("value") is not None)
        lines.append(f"{group or 'all runs'}: {picked} ({metric} {shown}, best of {finished})")
    return lines
