"""eval-algorithmic's tables: exact match per task × instance length of each run, and many runs' means side by side.

Input: the result docs of `posenc eval-algorithmic` (`eval/algorithmic.json`), one per run, with what was computed
from them: each run's per-task summaries (`evaluation.algorithmic.summarize`: accuracy per length, the
in-distribution and beyond-L means) and each run's competence gates (task -> a gate with `status`, `accuracy` and
`lengths`; `evaluation.competence`). Pure functions of those; the CLI prints what they return.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from posenc_cli.report.colours import accuracy_style
from posenc_cli.report.gate import (
    DEFAULT_COMPETENCE,
    GATE_MARK,
    GATE_STYLE,
    NOT_TRAINED,
    gate_note,
    is_flagged,
    state_cell,
)
from posenc_cli.report.tables import LABEL_MAX_WIDTH, fit_to_content, run_label

__all__ = ["percent_cell", "run_tables", "summary_table"]

Gates = Sequence[dict[str, Any]]  # per run: task -> its competence gate


def percent_cell(value: float | None) -> Text:
    """An accuracy as a coloured percentage (no sign), n/a dimmed."""
    if value is None or math.isnan(value):
        return Text("n/a", style="dim")
    return Text(f"{value * 100:.0f}", style=accuracy_style(value))


def run_tables(
    results: Sequence[dict[str, Any]],
    summaries: Sequence[Sequence[Any]],
    gates: Gates,
    competence: float = DEFAULT_COMPETENCE,
) -> list[Table]:
    """One table per run: rows = tasks, columns = instance lengths (exact-match %), then the means in distribution
    (lengths <= L) and beyond (L+1..2L), and the competence gate's verdict at `competence` (a task the run did not
    learn in distribution, or was never trained on, is marked: its beyond-L numbers measure no learned skill)."""
    tables = []
    for r, run_summaries, run_gates in zip(results, summaries, gates, strict=True):
        if not run_summaries:
            continue
        lengths = sorted({n for s in run_summaries for n in s.accuracy})
        limit = run_summaries[0].max_length
        examples = sorted({int(e["examples"]) for e in r["entries"]})
        table = Table(title=run_label(r), title_justify="left", caption_justify="left", header_style="bold")
        table.add_column("task", no_wrap=True)
        for n in lengths:
            table.add_column(str(n), justify="right", no_wrap=True, style="dim" if n > limit else "")
        table.add_column("≤L", justify="right", no_wrap=True)
        table.add_column("L+1..2L", justify="right", no_wrap=True)
        table.add_column("gate", no_wrap=True)
        for s in run_summaries:
            cells = [percent_cell(s.accuracy.get(n)) if n in s.accuracy else "" for n in lengths]
            table.add_row(
                s.task,
                *cells,
                percent_cell(s.in_distribution),
                percent_cell(s.beyond),
                state_cell(run_gates[s.task].status),
            )
        reasons = sorted({str(e["reason"]) for e in r["entries"] if e.get("status") != "ok" and e.get("reason")})
        if all(g.status == NOT_TRAINED for g in run_gates.values()):  # L is the asked (or the paper's) length
            where = f"L = {limit} (asked; ⊘ not trained on this task: the run never trained on these tasks)"
        else:
            spans = sorted({g.lengths for g in run_gates.values() if g.lengths is not None})
            trained = ", ".join(f"{lo}..{hi}" for lo, hi in spans) or f"<= {limit}"
            where = f"L = {limit} (trained on lengths {trained}: the ≤L column)"
        table.caption = "\n".join(
            [
                f"Exact-match accuracy (%) of greedy answers per instance length; {where}; "
                f"{'/'.join(map(str, examples))} examples per cell.",
                gate_note(competence),
                *(f"n/a: {reason}" for reason in reasons),
            ]
        )
        tables.append(fit_to_content(table))
    return tables


def summary_table(
    results: Sequence[dict[str, Any]],
    summaries: Sequence[Sequence[Any]],
    gates: Gates,
    competence: float = DEFAULT_COMPETENCE,
) -> Table | None:
    """Many runs at a glance: rows = runs, columns = tasks, cells = in-distribution / beyond-L mean accuracy, with the
    competence gate's mark (at `competence`) after a task the run did not learn or never trained on; None for fewer
    than two runs (a run's own table says it all) or no task."""
    rows = [
        (run_label(r), {s.task: s for s in run_summaries}, run_gates)
        for r, run_summaries, run_gates in zip(results, summaries, gates, strict=True)
    ]
    tasks = list(dict.fromkeys(t for _, by_task, _ in rows for t in by_task))
    if len(rows) < 2 or not tasks:
        return None
    table = Table(title="≤L / L+1..2L exact match (%)", title_justify="left", header_style="bold")
    table.caption, table.caption_justify = gate_note(competence), "left"
    table.add_column("run", no_wrap=True, overflow="ellipsis", max_width=LABEL_MAX_WIDTH)
    for t in tasks:
        table.add_column(t, justify="center", no_wrap=True)
    for label, by_task, run_gates in rows:
        cells: list[Any] = [label]
        for t in tasks:
            s = by_task.get(t)
            if s is None:
                cells.append("")
                continue
            status = run_gates[t].status
            mark = Text(f" {GATE_MARK[status]}", style=GATE_STYLE[status]) if is_flagged(status) else ""
            cells.append(Text.assemble(percent_cell(s.in_distribution), " / ", percent_cell(s.beyond), mark))
        table.add_row(*cells)
    return fit_to_content(table)
