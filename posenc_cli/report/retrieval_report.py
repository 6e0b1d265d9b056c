"""eval-tasks' tables and heatmaps: RULER-style retrieval scores per run × length × depth, and many runs' means.

Input: the result docs of `posenc eval-tasks` (`eval/tasks.json`), one per run, and each run's competence gates
(`(task, scoring)` -> a gate with `status` and `accuracy`; `evaluation.competence`). RULER's effective length
(`report.effective_length`) is computed here from the cells shown. Pure functions of those; the CLI prints the
tables and writes the figures they return.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.table import Table
from rich.text import Text

from posenc_cli.report.colours import accuracy_style
from posenc_cli.report.effective_length import RULER_THRESHOLD, effective_length
from posenc_cli.report.gate import (
    DEFAULT_COMPETENCE,
    effective_cell,
    gate_cell,
    gate_legend,
    gate_note,
    mark_panel,
)
from posenc_cli.report.tables import LABEL_MAX_WIDTH, fit_to_content, run_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "depth_label",
    "length_scores",
    "scoring_of",
    "task_scorings",
    "task_summary_tables",
    "tasks_figure",
    "tasks_tables",
]

Gates = Sequence[dict[tuple[str, str], Any]]  # per run: (task, scoring) -> its competence gate


SCORING_TEXT = {
    "contains": "share of expected answers contained (case-insensitive) in {generate} generated tokens (RULER's "
    "string_match_all)",
    "exact": "exact score (posenc's, stricter than RULER's): the continuation cut to the answer's tokens, exact match "
    "for one answer, else the share of answers in it",
}


EFFECTIVE_NOTE = (
    "Effective length (RULER): the longest length up to which the mean over depths stays >= {threshold} (--threshold; "
    "RULER's is Llama-2-7B's 85.6% at 4K); ≥ N: the longest measured length still passes; none: the shortest fails."
)


def scoring_of(entry: dict[str, Any]) -> str:
    """A stored cell's scoring (cells from before it was recorded were "exact")."""
    return str(entry.get("scoring", "exact"))


def scoring_note(entries: Sequence[dict[str, Any]]) -> str:
    """The caption's words for how these cells (of one scoring) were scored, with their generation budgets."""
    scoring = scoring_of(entries[0]) if entries else "contains"
    budgets = sorted({int(e["generate"]) for e in entries if e.get("generate") is not None})
    text = SCORING_TEXT.get(scoring, scoring).format(generate="/".join(map(str, budgets)) or "?")
    return text[:1].upper() + text[1:]


def depth_of(entry: dict[str, Any]) -> float | None:
    """A cell's depth; None for a task without depth (RULER's CWE, FWE)."""
    return None if entry.get("depth") is None else float(entry["depth"])


def depth_label(depth: float | None) -> str:
    return "—" if depth is None else f"{depth * 100:g}%"


def _depth_order(depth: float | None) -> float:
    return -1.0 if depth is None else depth


def length_scores(entries: Sequence[dict[str, Any]]) -> list[tuple[int, float | None]]:
    """(length, mean score over its depths) of one run × task × scoring; None where a depth is n/a."""
    by_length: dict[int, list[dict[str, Any]]] = {}
    for e in entries:
        by_length.setdefault(int(e["length"]), []).append(e)
    out: list[tuple[int, float | None]] = []
    for length, cells in sorted(by_length.items()):
        scores = [float(e["score"]) for e in cells if e.get("status") == "ok" and e.get("score") is not None]
        out.append((length, sum(scores) / len(scores) if scores and len(scores) == len(cells) else None))
    return out


def threshold_text(threshold: float) -> str:
    return f"{threshold * 100:.3g}%"


def _grid(
    result: dict[str, Any], task: str, scoring: str | None = None
) -> tuple[list[tuple[int, float]], list[float | None], np.ndarray, list[str]]:
    """((length, multiple) rows, depth columns, scores with NaN for n/a, n/a notes) of one run's task (the cells of
    `scoring` only, when given)."""
    entries = [e for e in result["entries"] if e["task"] == task and scoring in (None, scoring_of(e))]
    rows = sorted({(int(e["length"]), float(e["multiple"])) for e in entries})
    cols = sorted({depth_of(e) for e in entries}, key=_depth_order)
    grid = np.full((len(rows), len(cols)), np.nan)
    reasons: dict[str, list[str]] = {}
    for e in entries:
        i, j = rows.index((int(e["length"]), float(e["multiple"]))), cols.index(depth_of(e))
        if e.get("status") == "ok" and e.get("score") is not None:
            grid[i, j] = float(e["score"])
        elif str(e["length"]) not in reasons.setdefault(e.get("reason") or "not measured", []):
            reasons[e.get("reason") or "not measured"].append(str(e["length"]))
    return rows, cols, grid, [f"{', '.join(v)}: {k}" for k, v in reasons.items()]


def tasks_tables(
    results: Sequence[dict[str, Any]],
    tasks: Sequence[str],
    gates: Gates,
    threshold: float = RULER_THRESHOLD,
    competence: float = DEFAULT_COMPETENCE,
) -> list[Table]:
    """One table per task: rows = run × length, columns = depths, their mean and (on a run's first row) the run's
    in-distribution score with the competence gate's verdict at `competence` (≤L) and RULER's effective length at
    `threshold` (marked for a run that did not learn the task); n/a dimmed with its reason."""
    tables = []
    for task, scoring in task_scorings(results, tasks):
        mine = [e for r in results for e in r["entries"] if e["task"] == task and scoring_of(e) == scoring]
        cols = sorted({depth_of(e) for e in mine}, key=_depth_order)
        trials = sorted({int(e["trials"]) for e in mine})
        title = f"{task} · {'RULER score' if scoring == 'contains' else 'exact score'}"
        table = Table(title=title, title_justify="left", caption_justify="left", header_style="bold")
        table.add_column("run", no_wrap=True, overflow="ellipsis", max_width=LABEL_MAX_WIDTH)
        table.add_column("length \\ depth", justify="right", no_wrap=True)
        for d in cols:
            table.add_column(depth_label(d), justify="center", no_wrap=True)
        table.add_column("mean", justify="right")
        table.add_column("≤L", justify="right", no_wrap=True)
        table.add_column(f"effective (≥ {threshold_text(threshold)})", justify="right", no_wrap=True)
        notes = []
        for n, r in enumerate(results):
            if n:
                table.add_section()
            rows, rcols, grid, reasons = _grid(r, task, scoring)
            own = [e for e in r["entries"] if e["task"] == task and scoring_of(e) == scoring]
            gate = gates[n][(task, scoring)]
            effective = effective_cell(effective_length(length_scores(own), threshold).label, gate.status)
            for i, (length, multiple) in enumerate(rows):
                cells: list[Any] = [run_label(r) if i == 0 else "", f"{multiple:g}× · {length}"]
                for d in cols:
                    value = grid[i, rcols.index(d)] if d in rcols else math.nan
                    if math.isnan(value):
                        cells.append(Text("n/a", style="dim"))
                    else:
                        cells.append(Text(f" {value:.0%} ", style=accuracy_style(value)))
                full = grid[i].size > 0 and not np.isnan(grid[i]).any()
                cells.append(f"{grid[i].mean():.0%}" if full else Text("n/a", style="dim"))
                cells.append(gate_cell(gate.status, gate.accuracy) if i == 0 else "")
                cells.append(effective if i == 0 else "")
                table.add_row(*cells)
            notes += [f"n/a for {run_label(r)} at {reason}" for reason in reasons]
        table.caption = "\n".join(
            [
                f"{scoring_note(mine)}, {'/'.join(map(str, trials))} trials per cell; columns: depth "
                "of the first needle or asked pair (—: a task without depth); rows: prompt + generated tokens.",
                f"≤L: the mean score at lengths up to the training length. {gate_note(competence)}",
                EFFECTIVE_NOTE.format(threshold=threshold_text(threshold)),
                *notes,
            ]
        )
        tables.append(fit_to_content(table))
    return tables


def task_scorings(results: Sequence[dict[str, Any]], tasks: Sequence[str]) -> list[tuple[str, str]]:
    """(task, scoring) pairs present in `results`, in the order of `tasks`, "contains" first."""
    present = {(e["task"], scoring_of(e)) for r in results for e in r["entries"]}
    return [(t, s) for t in tasks for s in ("contains", "exact") if (t, s) in present]


def tasks_figure(
    results: Sequence[dict[str, Any]], tasks: Sequence[str], gates: Gates, competence: float = DEFAULT_COMPETENCE
) -> Figure:
    """Heatmaps: one row per run, one column per task (lengths × depths, RdYlGn from 0 to 1, n/a grey); the panel of
    a run that did not learn the task (competence gate at `competence`) or never trained on it is hatched over and
    says so in its title, with a legend entry per such state."""
    # deferred: matplotlib costs a second of start-up, and only --plot draws
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    nrows, ncols = max(len(results), 1), max(len(tasks), 1)
    fig = Figure(figsize=(3.4 * ncols + 1.2, 2.7 * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    image = None
    states = []
    for a, r in enumerate(results):
        for b, task in enumerate(tasks):
            ax = axes[a, b]
            rows, cols, grid, _ = _grid(r, task)
            image = ax.imshow(np.ma.masked_invalid(grid), cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
            ax.set_facecolor("0.85")
            for (i, j), value in np.ndenumerate(grid):
                ax.text(j, i, "n/a" if math.isnan(value) else f"{value:.0%}", ha="center", va="center", fontsize=8)
            ax.set_xticks(range(len(cols)), [depth_label(d) for d in cols])
            ax.set_yticks(range(len(rows)), [f"{m:g}× · {n}" for n, m in rows])
            ax.set_title(f"{run_label(r)} · {task}", fontsize=9)
            scorings = {scoring_of(e) for e in r["entries"] if e["task"] == task}
            if scorings:
                scoring = "contains" if "contains" in scorings else "exact"
                states.append(gates[a][(task, scoring)].status)
                mark_panel(ax, states[-1])
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), label="RULER score", shrink=0.9)
    gate_legend(fig, states, competence)
    return fig


def task_summary_tables(
    results: Sequence[dict[str, Any]],
    tasks: Sequence[str],
    gates: Gates,
    threshold: float = RULER_THRESHOLD,
    competence: float = DEFAULT_COMPETENCE,
) -> list[Table]:
    """One compact table per task for many runs: rows = runs, columns = lengths, cells = the mean score over the
    measured depths (`posenc eval-tasks DIR` prints every depth), then the in-distribution score with the competence
    gate's verdict at `competence` (≤L) and RULER's effective length at `threshold`, marked for a run that did not
    learn the task."""
    tables = []
    for task, scoring in task_scorings(results, tasks):
        entries = [(r, e) for r in results for e in r["entries"] if e["task"] == task and scoring_of(e) == scoring]
        multiples = sorted({float(e["multiple"]) for _, e in entries})
        depths = sorted({depth_of(e) for _, e in entries}, key=_depth_order)
        trials = sorted({int(e["trials"]) for _, e in entries})
        name = "RULER score" if scoring == "contains" else "exact score"
        table = Table(title=f"{task} · {name}, mean over depths", title_justify="left", caption_justify="left")
        table.add_column("run", no_wrap=True, overflow="ellipsis", max_width=LABEL_MAX_WIDTH)
        for m in multiples:
            table.add_column(f"{m:g}×", justify="center", no_wrap=True)
        table.add_column("≤L", justify="right", no_wrap=True)
        table.add_column(f"effective (≥ {threshold_text(threshold)})", justify="right", no_wrap=True)
        for r, run_gates in zip(results, gates, strict=True):
            mine = [e for e in r["entries"] if e["task"] == task and scoring_of(e) == scoring]
            if not mine:
                continue
            cells: list[Any] = [run_label(r)]
            for m in multiples:
                at = [e for e in mine if float(e["multiple"]) == m]
                scores = [float(e["score"]) for e in at if e.get("status") == "ok" and e.get("score") is not None]
                if not at or len(scores) < len(at):
                    cells.append(Text("n/a", style="dim"))
                    continue
                value = sum(scores) / len(scores)
                cells.append(Text(f" {value:.0%} ", style=accuracy_style(value)))
            gate = run_gates[(task, scoring)]
            cells.append(gate_cell(gate.status, gate.accuracy))
            cells.append(effective_cell(effective_length(length_scores(mine), threshold).label, gate.status))
            table.add_row(*cells)
        table.caption = (
            f"{scoring_note([e for _, e in entries])}; depths {', '.join(map(depth_label, depths))}; "
            f"{'/'.join(map(str, trials))} trials per cell; n/a: a length the scheme cannot read or that cannot hold "
            "the prompt (reasons: posenc eval-tasks DIR). "
            + EFFECTIVE_NOTE.format(threshold=threshold_text(threshold))
            + f"\n≤L: the mean score at lengths up to the training length. {gate_note(competence)}"
        )
        tables.append(fit_to_content(table))
    return tables
