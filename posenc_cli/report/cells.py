"""Generic result tables: columns × rows of `Cell`s, rendered by `render_table`.

A cell holds one value per member (a run, or the seeds of a sweep group) and renders as `mean` or `mean ± std`; the
best mean per column is bold. An empty cell says why, and each reason looks different: "n/a" (dimmed) when the length
was tried and the scheme cannot serve it, "n/m" when it could not be measured on that corpus (too few tokens for one
window, or a length below the fixed target), "nan" when the loss was not finite (reasons in the caption), and "–"
when it was never measured (see `cell_kind`). Building a table prints nothing; `fit_to_content` measures it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

from posenc_cli.report.reference_tables import separated_best

__all__ = [
    "CANNOT",
    "LABEL_MAX_WIDTH",
    "LABEL_WRAP_WIDTH",
    "LEGEND",
    "LONGPPL_LEGEND",
    "NON_FINITE",
    "NOT_MEASURED",
    "NO_KEY_TOKENS",
    "UNMEASURABLE",
    "Cell",
    "Column",
    "TableRow",
    "cell_kind",
    "fit_to_content",
    "fmt_cell",
    "fmt_number",
    "render_table",
    "table_legend",
]


@dataclass(frozen=True)
class Column:
    key: Any
    header: str
    best: Literal["min", "max"] | None = "min"


NOT_MEASURED = "–"
CANNOT = "n/a"
UNMEASURABLE = "n/m"
NON_FINITE = "nan"
NO_KEY_TOKENS = "none"  # LongPPL beyond the training length with no key token to average
LEGEND = {
    CANNOT: "n/a = the scheme cannot read that many tokens (reasons below)",
    UNMEASURABLE: "n/m = not measurable there: the corpus holds no window that long, the length is below the fixed "
    "target, or a ratio's two cells scored different token counts (reasons below)",
    NON_FINITE: "nan = the loss was not finite",
    NOT_MEASURED: f"{NOT_MEASURED} = not measured",
}
# LongPPL's n/a says more: at or below the training length there is nothing beyond it to measure.
LONGPPL_LEGEND = {
    **LEGEND,
    CANNOT: "n/a = LongPPL cannot be measured at or below the training length, or the scheme cannot read that many "
    "tokens (reasons below)",
    UNMEASURABLE: "n/m = not measurable there: stored without LongPPL, the corpus holds no window that long, or the "
    "length is below the fixed target (reasons below)",
    NO_KEY_TOKENS: "none = beyond the training length but no key token: the longer context never raised a token's "
    "log-probability by more than α = 2 (LongPPL has nothing to average)",
}
# What an entry's non-ok state is shown as. Entries written before the states were told apart say "n/a" for all of
# them; their reason text tells which (the same reading as `evaluation.results.cell_status`, which this layer
# cannot import).
_MARKS = {"n/a": CANNOT, "too_few_tokens": UNMEASURABLE, "shorter_than_target": UNMEASURABLE, "non_finite": NON_FINITE}
_LEGACY_REASONS = {
    "validation split has": UNMEASURABLE,
    "shorter than the fixed target": UNMEASURABLE,
    "non-finite loss": NON_FINITE,
}


def cell_kind(entry: dict[str, Any]) -> str:
    """The mark of an entry without a value: n/a (beyond the scheme), n/m (too few tokens, shorter than the fixed
    target) or nan (non-finite loss); an unknown state reads n/m (not measured there, not the scheme's fault)."""
    status = str(entry.get("status"))
    if status == "n/a":
        reason = str(entry.get("reason") or "")
        return next((mark for start, mark in _LEGACY_REASONS.items() if reason.startswith(start)), CANNOT)
    return _MARKS.get(status, UNMEASURABLE)


@dataclass
class Cell:
    """Values of one (row, column), one per member. Empty with a `reason` was tried and has no value (`kind`: n/a,
    the scheme cannot; n/m, not measurable there; nan); empty without one was never measured."""

    values: list[float] = field(default_factory=list)
    reason: str | None = None
    kind: str = CANNOT

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) > 1 else None


@dataclass
class TableRow:
    label: str
    cells: dict[Any, Cell]
    group: str | None = None
    members: int = 1


def fmt_number(value: float) -> str:
    """Perplexities span 1.5 to 10⁵: keep about four significant digits without scientific notation below 10⁶."""
    a = abs(value)
    if a >= 1e6:
        return f"{value:.3g}"
    if a >= 1000:
        return f"{value:,.0f}"
    if a >= 100:
        return f"{value:.1f}"
    if a >= 10:
        return f"{value:.2f}"
    return f"{value:.3f}"


def fmt_cell(cell: Cell) -> str:
    if cell.mean is None:
        return cell.kind if cell.reason else NOT_MEASURED
    text = fmt_number(cell.mean)
    return f"{text} ± {fmt_number(cell.std)}" if cell.std is not None else text


LABEL_MAX_WIDTH = 40  # longer run names end in "…" (task and cost tables)
LABEL_WRAP_WIDTH = 56  # result tables: longer labels wrap onto a second line


def fit_to_content(table: Table) -> Table:
    """Fix the table at its natural width, so a narrow terminal never squeezes a column away (rich would shrink
    the run names to nothing to fit the numbers); wider than the terminal, the lines run on instead."""
    table.width = Console(width=100_000).measure(table).maximum
    return table


def render_table(
    columns: Sequence[Column],
    rows: Sequence[TableRow],
    *,
    title: str | None = None,
    caption: str | None = None,
    label_header: str = "run",
    legend: Mapping[str, str] = LEGEND,
) -> Table:
    """A rich table: rows × columns, best mean per column bold, n/a and – dimmed, a section per row group; the
    caption opens with a legend line (`legend`'s text) for whichever of n/a and – the table shows."""
    legend_line = table_legend(columns, rows, legend)
    caption = "\n".join(x for x in (legend_line, caption) if x) or None
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left", header_style="bold")
    # a long label wraps rather than lose its end (the corpus, precision or directory that tells rows apart)
    table.add_column(label_header, overflow="fold", max_width=LABEL_WRAP_WIDTH)
    for col in columns:
        width = max([len(fmt_cell(r.cells.get(col.key, Cell()))) for r in rows] + [3])
        table.add_column(col.header, justify="right", no_wrap=True, min_width=width)
    best: dict[Any, float] = {}  # bold only when ahead of the next by more than the seed spread
    for col in columns:
        spread = {str(i): (m, r.cells[col.key].std) for i, r in enumerate(rows) if (m := _mean(r, col.key)) is not None}
        if col.best and len(spread) > 1:
            winner = separated_best(spread, lower_is_better=col.best == "min")
            if winner is not None:
                best[col.key] = spread[winner][0]
    previous_group: str | None = None
    for i, row in enumerate(rows):
        if i and row.group != previous_group:
            table.add_section()
        previous_group = row.group
        label = Text(row.label)
        if row.members > 1:
            label.append(f" (n={row.members})", style="dim")
        rendered: list[Text | str] = [label]
        for col in columns:
            cell = row.cells.get(col.key, Cell())
            if cell.mean is None:
                rendered.append(Text(fmt_cell(cell), style="dim"))
            else:
                style = "bold" if col.key in best and cell.mean == best[col.key] else ""
                rendered.append(Text(fmt_cell(cell), style=style))
        table.add_row(*rendered)
    return fit_to_content(table)


def table_legend(columns: Sequence[Column], rows: Sequence[TableRow], legend: Mapping[str, str] = LEGEND) -> str:
    """'n/a = ...; – = not measured' for the empty-cell marks that appear in the table ('' when none does)."""
    marks = {fmt_cell(r.cells.get(c.key, Cell())) for r in rows for c in columns}
    return "; ".join(text for mark, text in legend.items() if mark in marks)


def _mean(row: TableRow, key: Any) -> float | None:
    cell = row.cells.get(key)
    return cell.mean if cell is not None else None
