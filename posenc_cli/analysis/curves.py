"""Learning curves: a task's in-distribution accuracy against training steps, from runs that differ only in them.

Issue #38: a row that stays below the competence gate at the chosen steps is "not learned", and a run of twice the
steps (a sweep's `not_learned_only` stage) is its learning curve's next point; the row then reads "not learned"
with its curve instead of a beyond-L number. The points of one curve are runs of one experiment and one seed whose
saved configs are equal but for `train.steps` (and DroPE's `train.drope_at`, compared as its fraction of the steps:
7/8 of 4,000 and 7/8 of 8,000 are one recipe), e.g. a grid run at 6,000 steps and its pick's run at 12,000.

`curve_frame` gives every point (one row per curve × task × scoring × steps) for the runs that have a point at two
step counts or more; `curve_table` lays a frame out as one row per curve × task and one column per step count.
The gate of each point is the task tables' own (`evaluation.competence.result_competence`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from posenc_cli.analysis.task_results import task_units
from posenc_cli.evaluation.competence import check_threshold, result_competence
from posenc_cli.report.gate import DEFAULT_COMPETENCE, gate_note, gate_text

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CURVE_COLUMNS", "curve_frame", "curve_markdown", "curve_table", "experiment_key"]

CURVE_COLUMNS = ["curve", "task", "scoring", "steps", "in_distribution", "competence", "learned", "run_dir"]
STEP_KEYS = ("train.steps", "train.drope_at")  # what may differ between the points of one curve


def experiment_key(identity: str | None) -> tuple[str, int] | None:
    """(the identity without the steps, the steps) of a run's saved config identity (`rows.config_identity`, JSON);
    DroPE's drop step kept as its fraction of the steps. None for a run without one (a transformers directory)."""
    if identity is None:
        return None
    flat = json.loads(identity)
    steps = flat.get("train.steps")
    if not isinstance(steps, int) or steps <= 0:
        return None
    drop = flat.get("train.drope_at") or 0
    rest = {k: v for k, v in flat.items() if k not in STEP_KEYS}
    rest["train.drope_fraction"] = round(drop / steps, 9)
    return json.dumps(rest, sort_keys=True, default=str), steps


def curve_frame(records: Sequence[Any], threshold: float = DEFAULT_COMPETENCE) -> pd.DataFrame:
    """Every point of every learning curve in `records` (`analysis.rows.RunRecord`s): one row per curve × task ×
    scoring × steps, columns `CURVE_COLUMNS` (curve: the label of the curve's first run, its seed named; in_distribution
    and competence: the gate's accuracy and state; NaN accuracy when none). Only experiments × seeds with points at
    two step counts or more; of two runs of one config and seed (a copied grid run), the first. Only those runs'
    results files are read."""
    # deferred: pandas costs seconds of start-up
    import pandas as pd

    check_threshold(threshold)
    points: dict[tuple[str, int | None], dict[int, Any]] = {}  # (experiment, seed) -> steps -> record
    for record in records:
        key = experiment_key(record.identity) if record.status != "failed" else None
        if key is not None:
            points.setdefault((key[0], record.seed), {}).setdefault(key[1], record)
    named: dict[str, tuple[str, int]] = {}  # the run directory of each point -> (its curve's name, its steps)
    for steps in (steps for steps in points.values() if len(steps) > 1):
        first = steps[min(steps)]
        name = first.label if first.seed is None else f"{first.label} · seed {first.seed}"
        named.update((str(record.run_dir), (name, n)) for n, record in steps.items())
    rows = []
    chosen = [r for r in records if str(r.run_dir) in named]  # no curve: no results file read
    for result, task, family, scoring in task_units(chosen) if chosen else []:
        name, steps = named[result["path"]]
        gate = result_competence(result, task, family, threshold, scoring)
        rows.append(
            {
                "curve": name,
                "task": task,
                "scoring": scoring or "",
                "steps": steps,
                "in_distribution": float("nan") if gate.accuracy is None else gate.accuracy,
                "competence": gate.status,
                "learned": gate.learned,
                "run_dir": result["path"],
            }
        )
    frame = pd.DataFrame(rows, columns=CURVE_COLUMNS)
    frame = frame.sort_values(["curve", "task", "scoring", "steps"], kind="stable").reset_index(drop=True)
    frame.attrs["competence"] = threshold
    return frame


def curve_table(frame: pd.DataFrame) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, caption) of `curve_frame`'s points: one row per curve × task, one column per step count, each
    cell the in-distribution accuracy with the gate's mark ('13% ✗ not learned', '–' where the curve has no run)."""
    steps = sorted({int(s) for s in frame["steps"]})
    headers = ["curve", "task", *(f"{s:,} step{'' if s == 1 else 's'}" for s in steps)]
    rows = []
    for (curve, task, scoring), part in frame.groupby(["curve", "task", "scoring"], sort=False):
        cells = {int(p.steps): p for p in part.itertuples()}
        shown = [_cell(cells[s]) if s in cells else "–" for s in steps]
        rows.append([str(curve), f"{task} ({scoring})" if scoring else str(task), *shown])
    threshold = float(frame.attrs.get("competence", DEFAULT_COMPETENCE))
    return headers, rows, gate_note(threshold)


def curve_markdown(records: Sequence[Any], threshold: float = DEFAULT_COMPETENCE) -> str:
    """The learning curves among the records as a markdown table, then the gate's caption; "" without a curve."""
    frame = curve_frame(records, threshold)
    if frame.empty:
        return ""
    headers, rows, caption = curve_table(frame)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + f"\n\n{caption}\n"


def _cell(point: Any) -> str:
    accuracy = None if math.isnan(point.in_distribution) else float(point.in_distribution)
    return gate_text(str(point.competence), accuracy)
