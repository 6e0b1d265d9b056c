"""Sweep files: where they are found, and their parsing into a `SweepSpec` of `StageSpec`s.

A sweep file (`configs/sweep/NAME.yaml`, or `sweep/NAME.yaml` in a user's `--config-dir`) declares global overrides
and one or more stages. Each stage is one Hydra multirun (see `hydra_bridge.launch_multirun`): stage `train` jobs
train and evaluate a run; `extend` jobs derive a run from an earlier stage's run (RoPE scaling, optional
fine-tune) and evaluate it; `select` jobs train and evaluate a grid, from which `sweep.select` picks each group's
setting (per scheme, as McGill-NLP/length-generalization's `configs/sweeps/training_scratch.jsonnet` does), and a
later train stage with `after: <select stage>` runs with each group's pick. `sweep.plan` expands the stages into jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from posenc_cli.config import suggest
from posenc_cli.errors import ConfigError

SELECT_METRICS = ("val_loss", "competence")  # see `sweep.select.METRIC_GOALS`
SELECT_SCORINGS = ("contains", "exact")  # a RULER-style task's scorings (eval-tasks --scoring); "contains" is RULER's


@dataclass(frozen=True, kw_only=True)
class SelectSpec:
    """How a `select` stage picks: `metric` (`val_loss`, minimised: the run's final validation loss; `competence`,
    maximised: in-distribution accuracy on `task`, scored as `scoring`), per group of `group_by` keys; `partial`:
    pick among the finished grid points of a group when some failed or did not finish (else refuse)."""

    metric: str = "val_loss"
    group_by: tuple[str, ...] = ("pos",)
    partial: bool = False
    task: str | None = None
    scoring: str = "contains"


@dataclass(kw_only=True)
class StageSpec:
    name: str
    action: Literal["train", "extend", "select"] = "train"
    params: dict[str, str] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    parent: str | None = None
    label: str | None = None
    select: SelectSpec | None = None  # a select stage's rule
    after: str | None = None  # a train stage's select stage, whose picks its jobs run with
    runs_for: Literal["learned", "not learned"] | None = None  # an `after` stage's: only the groups whose pick
    # passed (`learned_only: true`) or failed (`not_learned_only: true`) the competence gate
    gate_by: str | None = None  # a `runs_for` stage's: the earlier train stage whose runs, one by one, it is gated
    # by (each job by its own run there: the same group and values of the keys both stages sweep), not the pick


@dataclass(kw_only=True)
class SweepSpec:
    name: str
    path: Path
    overrides: list[str] = field(default_factory=list)
    stages: list[StageSpec] = field(default_factory=list)


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
        valid = [
            "name",
            "action",
            "params",
            "overrides",
            "parent",
            "label",
            "group_by",
            "select",
            "after",
            "learned_only",
            "not_learned_only",
            "gate_by",
        ]
        bad = set(st) - set(valid)
        if bad:
            key = str(sorted(bad, key=str)[0])
            hint = suggest(key, valid)
            raise ConfigError(
                f"{path}: stage '{st['name']}' has unknown key '{key}'{hint} (valid: {', '.join(sorted(valid))})"
            )
        action = st.get("action", "train")
        if action not in ("train", "extend", "select"):
            raise ConfigError(f"{path}: stage '{st['name']}': action must be train, extend or select, got {action!r}")
        if action == "extend" and not st.get("parent"):
            raise ConfigError(f"{path}: extend stage '{st['name']}' needs parent: <stage>/<key=value,...>")
        params = {str(k): _param_str(v) for k, v in (st.get("params") or {}).items()}
        select = _select_spec(path, st, action)
        after = _after(path, st, action, stages)
        runs_for = _runs_for(path, st, after, stages)
        gate_by = _gate_by(path, st, after, runs_for, stages)
        stages.append(
            StageSpec(
                name=str(st["name"]),
                action=action,
                params=params,
                overrides=[str(o) for o in st.get("overrides") or []],
                parent=st.get("parent"),
                label=st.get("label"),
                select=select,
                after=after,
                runs_for=runs_for,
                gate_by=gate_by,
            )
        )
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: stage names must be unique")
    return SweepSpec(
        name=Path(path).stem, path=Path(path), overrides=[str(o) for o in raw.get("overrides") or []], stages=stages
    )


def _select_spec(path: Path, st: dict[str, Any], action: str) -> SelectSpec | None:
    """A select stage's `group_by` (a key or a list; default `pos`) and `select:` mapping, checked."""
    name = st["name"]
    if action != "select":
        for key in ("group_by", "select"):
            if key in st:
                raise ConfigError(f"{path}: stage '{name}': '{key}' belongs to a select stage (action: select)")
        return None
    raw = st.get("select") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: stage '{name}': select must be a mapping, e.g. {{metric: val_loss}}")
    valid = ["metric", "partial", "task", "scoring"]
    bad = set(raw) - set(valid)
    if bad:
        key = str(sorted(bad, key=str)[0])
        hint = suggest(key, valid)
        raise ConfigError(f"{path}: stage '{name}': unknown select key '{key}'{hint} (valid: {', '.join(valid)})")
    metric = str(raw.get("metric", "val_loss"))
    if metric not in SELECT_METRICS:
        hint = suggest(metric, SELECT_METRICS)
        raise ConfigError(
            f"{path}: stage '{name}': select.metric '{metric}'{hint} is not one of {', '.join(SELECT_METRICS)}"
        )
    task = raw.get("task")
    if metric == "competence" and not task:
        raise ConfigError(
            f"{path}: stage '{name}': select.metric competence needs select.task (an algorithmic task, "
            "'algorithmic' for the mean over the run's tasks, 'passkey', a RULER-style task or 'tasks' for the mean "
            "over the run's RULER-style tasks)"
        )
    scoring = str(raw.get("scoring", "contains"))
    if scoring not in SELECT_SCORINGS:
        raise ConfigError(
            f"{path}: stage '{name}': select.scoring '{scoring}' is not one of {', '.join(SELECT_SCORINGS)}"
        )
    partial = raw.get("partial", False)
    if not isinstance(partial, bool):
        raise ConfigError(f"{path}: stage '{name}': select.partial must be true or false, got {partial!r}")
    group_by = st.get("group_by", ["pos"])
    group_by = [group_by] if isinstance(group_by, str) else group_by
    if not isinstance(group_by, list) or not all(isinstance(k, str) and k for k in group_by):
        raise ConfigError(f"{path}: stage '{name}': group_by must be a key or a list of keys, e.g. [pos]")
    return SelectSpec(
        metric=metric,
        group_by=tuple(group_by),
        partial=partial,
        task=None if task is None else str(task),
        scoring=scoring,
    )


def _after(path: Path, st: dict[str, Any], action: str, earlier: list[StageSpec]) -> str | None:
    """A train stage's `after:`, which must name an earlier select stage."""
    after = st.get("after")
    if after is None:
        return None
    if action != "train":
        raise ConfigError(f"{path}: stage '{st['name']}': after: is for a train stage (an {action} stage has none)")
    selects = [s.name for s in earlier if s.action == "select"]
    return _one_of(f"{path}: stage '{st['name']}': after", after, selects, "an earlier select stage")


def _runs_for(
    path: Path, st: dict[str, Any], after: str | None, earlier: list[StageSpec]
) -> Literal["learned", "not learned"] | None:
    """A stage's `learned_only: true` (issue #44: seeds only for the rows that learned) or `not_learned_only: true`
    (issue #38: twice the steps only for the rows still below the gate, the learning curve's last point), each of
    which needs `after:` a select stage that picks by competence; at most one of the two."""
    wanted: list[Literal["learned", "not learned"]] = []
    for key, runs_for in (("learned_only", "learned"), ("not_learned_only", "not learned")):
        value = st.get(key, False)
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: stage '{st['name']}': {key} must be true or false, got {value!r}")
        if value:
            select = next((s.select for s in earlier if s.name == after), None)
            if select is None or select.metric != "competence":
                raise ConfigError(
                    f"{path}: stage '{st['name']}': {key} needs after: a select stage with select.metric competence"
                )
            wanted.append(runs_for)
    if len(wanted) > 1:
        raise ConfigError(f"{path}: stage '{st['name']}': learned_only and not_learned_only exclude each other")
    return wanted[0] if wanted else None


def _gate_by(
    path: Path, st: dict[str, Any], after: str | None, runs_for: str | None, earlier: list[StageSpec]
) -> str | None:
    """A gated stage's `gate_by: <stage>`: gate each job by its own run of that earlier train stage (a seed's longer
    run by that seed's run, say), not by the pick; the stage must run after the same select stage."""
    gate_by = st.get("gate_by")
    if gate_by is None:
        return None
    name = f"{path}: stage '{st['name']}'"
    if runs_for is None:
        raise ConfigError(f"{name}: gate_by needs learned_only: true or not_learned_only: true")
    candidates = [s.name for s in earlier if s.action == "train" and s.after == after]
    return _one_of(f"{name}: gate_by", gate_by, candidates, f"an earlier train stage with after: {after}")


def _one_of(where: str, value: Any, names: list[str], what: str) -> str:
    """`value` when it is one of the stage `names`, else a one-line `ConfigError` naming them, with a suggestion."""
    if value not in names:
        hint = suggest(str(value), names)
        raise ConfigError(f"{where}: '{value}'{hint} is not {what} (those: {', '.join(names) or 'none'})")
    return str(value)


def _param_str(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)
