"""Task tables over seeds (`posenc compare --seed-mean`): one table per task × scoring, one row per experiment, the
mean ± sd of its seeds' scores per length, their mean in-distribution score and how many seeds passed the gate.

Input: the rows of `analysis.task_seeds.seed_rows` (or its DataFrame's records: NaN reads as no number), one per
experiment × task × scoring × length. Pure functions of those: rich tables for the terminal, markdown text for
`--format markdown`. RULER's effective length is not shown: it is a per-run number (the per-seed tables have it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from posenc_cli.report.colours import accuracy_style
from posenc_cli.report.gate import DEFAULT_COMPETENCE, GATE_MARK, GATE_STYLE, LEARNED, NOT_LEARNED
from posenc_cli.report.tables import LABEL_MAX_WIDTH, fit_to_content

__all__ = ["seed_caption", "seed_gate_text", "seed_markdown", "seed_score_text", "seed_tables", "seed_title"]

Row = Mapping[str, Any]


def _number(value: Any) -> float | None:
    """A float, or None for None and NaN (a DataFrame's empty cell)."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def seed_score_text(row: Row) -> str:
    """One length's cell in %: '61 ± 10' (mean ± sd), '61' for one seed, 'n/a (2/3)' where only 2 of 3 seeds scored
    it, 'n/a' where none did or the seeds' gate states differ."""
    mean, sd = _number(row["mean"]), _number(row["sd"])
    if mean is None:
        measured, n = int(row["measured"]), int(row["n"])
        return f"n/a ({measured}/{n})" if 0 < measured < n else "n/a"
    return f"{mean * 100:.0f}" if sd is None else f"{mean * 100:.0f} ± {sd * 100:.0f}"


def seed_gate_text(state: str, n_learned: int, n: int) -> str:
    """The gate column: '3/3 learned', '✗ 1/3 learned', or a state without a measure ('⊘ not trained on this task',
    with '· 2/3 learned' when other seeds learned)."""
    if state == LEARNED:
        return f"{n_learned}/{n} learned"
    if state == NOT_LEARNED:
        return f"✗ {n_learned}/{n} learned"
    mark = GATE_MARK.get(state, state)
    return f"{mark} · {n_learned}/{n} learned" if n_learned else mark


def _in_distribution_text(row: Row) -> str:
    value = _number(row["in_distribution"])
    return "n/a" if value is None else f"{value * 100:.0f}"


def _algorithmic(rows: Sequence[Row]) -> bool:
    """Rows of instance lengths (no multiple): columns by length, else by multiple."""
    return all(_number(r["multiple"]) is None for r in rows)


def seed_title(task: str, scoring: str, rows: Sequence[Row]) -> str:
    """'niah-single · RULER score over seeds (%, mean ± sd)', passkey's and an algorithmic task's likewise."""
    if _algorithmic(rows):
        what = f"{task} · exact match"
    elif task == "passkey":
        what = "passkey · exact-match accuracy"
    else:
        what = f"{task} · {'RULER score' if scoring == 'contains' else 'exact score'}"
    return f"{what} over seeds (%, mean ± sd)"


def _tables(rows: Sequence[Row]) -> list[tuple[str, str, list[Row]]]:
    """(task, scoring, its rows) in the rows' order."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((str(row["task"]), str(row["scoring"])), []).append(row)
    return [(task, scoring, group) for (task, scoring), group in groups.items()]


def _layout(group: Sequence[Row]) -> tuple[list[tuple[Any, str]], dict[str, dict[Any, Row]]]:
    """([(column key, header)], label -> column key -> row) of one table: columns by multiple ('2×'), or by instance
    length for an algorithmic task."""
    by_length = _algorithmic(group)
    key = (lambda r: int(r["length"])) if by_length else (lambda r: float(r["multiple"]))
    keys = sorted({key(r) for r in group})
    columns = [(k, str(k) if by_length else f"{k:g}×") for k in keys]
    cells: dict[str, dict[Any, Row]] = {}
    for row in group:
        cells.setdefault(str(row["label"]), {})[key(row)] = row
    return columns, cells


def seed_caption(competence: float = DEFAULT_COMPETENCE, *, retrieval: bool = True) -> list[str]:
    """What an over-seeds table shows; `retrieval`: say where RULER's effective length went."""
    effective = " RULER's effective length is per run: posenc compare without --seed-mean." if retrieval else ""
    return [
        "Mean ± sample sd over each row's n seeds (runs whose saved configs differ only in train.seed), in % of the "
        "score per length (mean over depths); n = 1: one run, no spread. n/a (k/n): only k of the n seeds scored "
        "the length, so no mean; n/a: none did, or the seeds' gate states differ.",
        f"≤L: the seeds' mean in-distribution score. Gate: the seeds past the competence gate (≥ {competence:.0%} at "
        "the lengths they trained on, --competence), ✗ unless every one is; a seed not trained on the task (⊘), "
        "longer than its training examples (⇥), that cannot be measured or was not measured gives the row its "
        f"state.{effective}",
    ]


def _score_cell(row: Row | None) -> Text:
    """A length's cell coloured by its mean (as the per-run tables), n/a dimmed; '–': the row has no such length."""
    if row is None:
        return Text("–", style="dim")
    mean = _number(row["mean"])
    if mean is None:
        return Text(seed_score_text(row), style="dim")
    return Text(f" {seed_score_text(row)} ", style=accuracy_style(mean))


def seed_tables(rows: Sequence[Row], competence: float = DEFAULT_COMPETENCE) -> list[Table]:
    """One rich table per task × scoring: rows = experiments (label, n), columns = lengths (mean ± sd in %, coloured
    by the mean), then ≤L and the gate's count styled by the row's state."""
    tables = []
    for task, scoring, group in _tables(rows):
        columns, cells = _layout(group)
        table = Table(title=seed_title(task, scoring, group), title_justify="left", caption_justify="left")
        table.add_column("run", no_wrap=True, overflow="ellipsis", max_width=LABEL_MAX_WIDTH)
        table.add_column("n", justify="right")
        for _, header in columns:
            table.add_column(header, justify="center", no_wrap=True)
        table.add_column("≤L", justify="right", no_wrap=True)
        table.add_column("gate", no_wrap=True)
        for label, by_key in cells.items():
            first = next(iter(by_key.values()))
            shown: list[Any] = [label, str(first["n"])]
            shown += [_score_cell(by_key.get(key)) for key, _ in columns]
            state = str(first["competence"])
            shown.append(_in_distribution_text(first))
            gate = seed_gate_text(state, int(first["n_learned"]), int(first["n"]))
            shown.append(Text(gate, style=GATE_STYLE.get(state, "")))
            table.add_row(*shown)
        table.caption = "\n".join(seed_caption(competence, retrieval=task != "passkey" and not _algorithmic(group)))
        tables.append(fit_to_content(table))
    return tables


def seed_markdown(rows: Sequence[Row], competence: float = DEFAULT_COMPETENCE) -> str:
    """The over-seeds tables as markdown: a bold title and a table per task × scoring (run, n, each length, ≤L, gate),
    then the caption once (lines ending in two spaces: markdown breaks); "" without rows."""
    parts = []
    retrieval = False
    for task, scoring, group in _tables(rows):
        columns, cells = _layout(group)
        retrieval = retrieval or (task != "passkey" and not _algorithmic(group))
        lines = [
            f"**{seed_title(task, scoring, group)}**",
            "",
            "| run | n | " + " | ".join(header for _, header in columns) + " | ≤L | gate |",
            "|---|---|" + "---|" * len(columns) + "---|---|",
        ]
        for label, by_key in cells.items():
            first = next(iter(by_key.values()))
            scores = [seed_score_text(by_key[k]) if k in by_key else "–" for k, _ in columns]
            gate = seed_gate_text(str(first["competence"]), int(first["n_learned"]), int(first["n"]))
            lines.append(f"| {label} | {first['n']} | {' | '.join(scores)} | {_in_distribution_text(first)} | {gate} |")
        parts.append("\n".join(lines))
    if not parts:
        return ""
    caption = "".join(f"\n{line}  " for line in seed_caption(competence, retrieval=retrieval))
    return "\n\n".join(parts) + "\n" + caption + "\n"
