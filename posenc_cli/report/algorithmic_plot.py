"""Accuracy against instance length, one panel per algorithmic task and one line per run (`eval-algorithmic --plot`).

Input: the result docs of `posenc eval-algorithmic` (`eval/algorithmic.json`, one per run: "run", "scheme",
"entries") and, optionally, each run's competence gates (task -> a gate with `status` and `lengths`,
`evaluation.competence`). Each task is drawn in the measure its reference reports (`metrics`: task -> the cell field,
e.g. "token_accuracy" for MQAR's per-query and flip-flop's per-read accuracy; "accuracy", exact match, otherwise),
which the caller reads off the task registry (this layer sees no registry). The lengths a run trained on are shaded,
so in distribution and beyond it read side by side; a run the gate flags (not learned, not trained on the task) is
drawn dashed and named so in the legend. A pure function of its inputs; the caller writes the figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from posenc_cli.report.gate import DEFAULT_COMPETENCE, GATE_MARK, is_flagged
from posenc_cli.report.plots import scheme_colour, shown_label

__all__ = ["METRIC_NAMES", "accuracy_by_length_figure", "task_series"]

Result = dict[str, Any]
METRIC_NAMES = {"accuracy": "exact match", "token_accuracy": "per-token accuracy"}


def task_series(result: Result, task: str, metric: str = "accuracy") -> tuple[list[int], list[float]]:
    """(lengths, values) of `task`'s measured cells in `result` (the latest cell per length; n/a and unmeasured
    cells left out), lengths ascending."""
    latest = {int(e["length"]): e for e in result["entries"] if str(e["task"]) == task}
    shown = [(n, e.get(metric)) for n, e in sorted(latest.items()) if e.get("status") == "ok"]
    points = [(n, float(v)) for n, v in shown if v is not None and math.isfinite(float(v))]
    return [n for n, _ in points], [v for _, v in points]


def _trained_span(result: Result, task: str, gate: Any) -> tuple[int, int] | None:
    """The lengths the run trained `task` on: the gate's `lengths`, else the cells' train_min_length..L."""
    if gate is not None and getattr(gate, "lengths", None) is not None:
        return gate.lengths
    cells = [e for e in result["entries"] if str(e["task"]) == task]
    if not cells:
        return None
    return min(int(e.get("train_min_length", 1)) for e in cells), max(int(e["train_max_length"]) for e in cells)


def accuracy_by_length_figure(
    results: Sequence[Result],
    gates: Sequence[Mapping[str, Any]] | None = None,
    metrics: Mapping[str, str] | None = None,
    competence: float = DEFAULT_COMPETENCE,
    title: str | None = None,
) -> Figure:
    """One panel per task (first-seen order over `results`), one line per run holding that task: its `metrics[task]`
    (default "accuracy") against instance length, the run's training lengths shaded in its colour. With `gates`
    (per run: task -> gate), a run flagged on a task is drawn dashed, its legend entry naming the gate's verdict
    (below `competence` in distribution, or not trained on the task)."""
    metrics = metrics or {}
    tasks = list(dict.fromkeys(str(e["task"]) for r in results for e in r["entries"]))
    ncols = min(max(len(tasks), 1), 3)
    nrows = max(math.ceil(len(tasks) / ncols), 1)
    fig = Figure(figsize=(4.4 * ncols + 0.4, 3.4 * nrows + 0.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for k, ax in enumerate(axes.flat):
        if k >= len(tasks):
            ax.set_axis_off()
            continue
        task = tasks[k]
        metric = metrics.get(task, "accuracy")
        spans: set[tuple[int, int]] = set()
        for i, r in enumerate(results):
            x, y = task_series(r, task, metric)
            if not x:
                continue
            gate = gates[i].get(task) if gates is not None else None
            flagged = gate is not None and is_flagged(gate.status)
            colour = scheme_colour(str(r.get("scheme", "")))
            label = shown_label(r) + (f" — {GATE_MARK[gate.status]}" if flagged else "")
            ax.plot(x, y, color=colour, ls="--" if flagged else "-", lw=1.6, marker="o", ms=2.5, label=label)
            span = _trained_span(r, task, gate)
            if span is not None:
                spans.add(span)
        for low, high in sorted(spans):
            ax.axvspan(low - 0.5, high + 0.5, color="0.85", zorder=0, lw=0)
        if spans:
            ax.plot([], [], color="0.85", lw=6, label="training lengths")
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("instance length")
        ax.set_ylabel(METRIC_NAMES.get(metric, metric))
        ax.set_title(task, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(title or f"Accuracy against length per scheme (competence gate at {competence:.0%})")
    return fig
