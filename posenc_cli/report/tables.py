"""Rich tables of evaluation results (`eval-extrapolate`, later `compare` and sweeps).

The generic part is `render_table`: columns × rows of `Cell`s, where a cell holds one value per member (a run, or
the seeds of a sweep group) and renders as `mean` or `mean ± std`; the best mean per column is bold. An empty cell
says why, and each reason looks different: "n/a" (dimmed) when the length was tried and the scheme cannot serve it,
"n/m" when it could not be measured on that corpus (too few tokens for one window, or a length below the fixed
target), "nan" when the loss was not finite (reasons in the caption), and "–" when it was never measured (see
`cell_kind`). `extrapolation_rows` turns
eval-extrapolate results (the docs returned by `perplexity.evaluate_run` or read by `results.load_results`) into
such rows, optionally aggregating several runs into one row and grouping rows into sections.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

from posenc_cli.report.reference_tables import separated_best

Result = dict[str, Any]  # one run: {"run", "scheme", "train_length", "base_length", "entries": [...], ...}


@dataclass(frozen=True)
class Column:
    key: Any
    header: str
    best: Literal["min", "max"] | None = "min"


NOT_MEASURED = "–"
CANNOT = "n/a"
UNMEASURABLE = "n/m"
NON_FINITE = "nan"
LEGEND = {
    CANNOT: "n/a = the scheme cannot read that many tokens (reasons below)",
    UNMEASURABLE: "n/m = not measurable there: the corpus holds no window that long, or the length is below the "
    "fixed target (reasons below)",
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


# ----------------------------------------------------------------------------------------------------------------
# eval-extrapolate results -> rows


def run_label(result: Result) -> str:
    """Run directory name plus scheme, e.g. `rope-0 (rope)`; kept as is when it already names the scheme as a word
    (`rope-yarnx8`, `pos=alibi`, `train/pos=t5`)."""
    run, scheme = str(result["run"]), str(result["scheme"])
    if not scheme or re.search(rf"(?<![^\W_]){re.escape(scheme)}(?![^\W_])", run):
        return run
    return f"{run} ({scheme})"


def column_key(entry: dict[str, Any], by: Literal["multiple", "length"]) -> float | int:
    return float(entry["multiple"]) if by == "multiple" else int(entry["length"])


def fmt_multiple(m: float) -> str:
    return f"{m:g}×"


def ratio_keys(keys: Sequence[Any], by: str, bases: set[int]) -> tuple[Any, Any] | None:
    """(numerator, denominator) columns of the ratio column: the longest length over 1× (the base length) when 1×
    is a column, else over the shortest length; None when fewer than two lengths were measured."""
    if len(keys) < 2:
        return None
    one = 1.0 if by == "multiple" else (next(iter(bases)) if len(bases) == 1 else None)
    den = one if one in keys and one != keys[-1] else keys[0]
    return keys[-1], den


def ratio_value(
    result: Result, by: Literal["multiple", "length"], keys: tuple[Any, Any], metric: str = "ppl"
) -> tuple[float | None, str | None]:
    """`metric` at column `keys[0]` / at column `keys[1]`; None when either is missing, with the reason when the
    scheme cannot serve one of them (no reason: not measured)."""
    found = {column_key(e, by): e for e in result["entries"]}
    pair = [found.get(k) for k in keys]
    if any(e is None for e in pair):
        return None, None
    for e in pair:
        if e.get("status") != "ok" or e.get(metric) is None:
            return None, _reason(e, metric)
    return pair[0][metric] / pair[1][metric], None


def _reason(entry: dict[str, Any], metric: str) -> str:
    return entry.get("reason") or f"no {metric} at {entry['length']} tokens"


# Metrics an evaluation may not have recorded for an ok cell, with why a recorded null has no value: LongPPL (Fang et
# al. 2024, arXiv 2410.23771) scores only key tokens, those whose loss falls with context beyond the training length,
# so it cannot be measured at or below it.
NULL_REASONS = {"longppl": "LongPPL cannot be measured at or below the training length (no context beyond it)"}


def _mark_unrecorded(cell: Cell, entry: dict[str, Any], metric: str) -> None:
    """An ok entry without `metric`: n/a when it recorded null for a reason (`NULL_REASONS`), n/m when the field is
    absent (measured before the metric was recorded); the first member's reason and kind win."""
    if cell.reason is None:
        if metric in entry:
            cell.reason, cell.kind = NULL_REASONS[metric], CANNOT
        else:
            cell.reason, cell.kind = f"{metric} not measured at {entry['length']} tokens", UNMEASURABLE


def _mark_empty(cell: Cell, entry: dict[str, Any], metric: str) -> None:
    """Record why `entry` gives `cell` no value (the first member's reason and kind win)."""
    if cell.reason is None:
        ok = entry.get("status") == "ok"
        cell.reason, cell.kind = _reason(entry, metric), (UNMEASURABLE if ok else cell_kind(entry))


def ratio_header(keys: tuple[Any, Any], by: str) -> str:
    name = fmt_multiple if by == "multiple" else str
    return f"{name(keys[0])} / {name(keys[1])}"


def extrapolation_rows(
    results: Sequence[Result],
    *,
    by: Literal["multiple", "length"] = "multiple",
    metric: str = "ppl",
    label: Callable[[Result], str] = run_label,
    aggregate_by: Callable[[Result], str] | None = None,
    group_by: Callable[[Result], str] | None = None,
    ratio: bool = True,
) -> tuple[list[Column], list[TableRow]]:
    """Columns (one per length, plus the ratio) and rows (one per run, or per `aggregate_by` key with mean ± std).

    Each result must hold at most one entry per length (one protocol/stride/data: `evaluate_run`'s output, or
    `results.pick_entries` of a stored doc). Rows keep the order of first appearance; with `group_by` they are
    ordered by group (stable) and the table draws a section per group.
    """
    keys = sorted({column_key(e, by) for r in results for e in r["entries"]})
    bases = {r["base_length"] for r in results}
    columns = [Column(k, _header(k, by, bases)) for k in keys]
    pair = ratio_keys(keys, by, bases) if ratio else None

    rows: dict[str, TableRow] = {}
    for r in results:
        name = aggregate_by(r) if aggregate_by else label(r)
        row = rows.get(name)
        if row is None:
            row = rows[name] = TableRow(name, {}, group=group_by(r) if group_by else None, members=0)
        row.members += 1
        if len({column_key(e, by) for e in r["entries"]}) != len(r["entries"]):
            raise ValueError(f"{r['run']}: several entries per length; select one protocol (results.pick_entries)")
        for e in r["entries"]:
            cell = row.cells.setdefault(column_key(e, by), Cell())
            if e.get("status") == "ok" and e.get(metric) is not None:
                cell.values.append(float(e[metric]))
            elif e.get("status") != "ok":
                _mark_empty(cell, e, metric)
            elif metric in NULL_REASONS:  # ok, but without this optional metric: n/a or n/m
                _mark_unrecorded(cell, e, metric)
            # otherwise measured without `metric` (no byte counts: bpb): left "–"
        if pair is not None:
            value, reason = ratio_value(r, by, pair, metric)
            cell = row.cells.setdefault("ratio", Cell())
            if value is None and reason is not None and cell.reason is None:
                found = {column_key(e, by): e for e in r["entries"]}
                empty = next(e for e in (found[k] for k in pair) if e.get("status") != "ok" or e.get(metric) is None)
                _mark_empty(cell, empty, metric)
            elif value is not None:
                cell.values.append(value)
    if pair is not None:
        columns.append(Column("ratio", ratio_header(pair, by), best=None))
    ordered = list(rows.values())
    if group_by:
        order = {g: i for i, g in enumerate(dict.fromkeys(r.group for r in ordered))}
        ordered.sort(key=lambda r: order[r.group])
    for row in ordered:  # a member without a value empties the cell rather than give a partial mean
        for cell in row.cells.values():
            if cell.values and len(cell.values) < row.members:
                cell.values = []  # n/a if a member cannot serve the length, else – (not measured for all)
    return columns, ordered


def _header(key: float | int, by: str, bases: set[int]) -> str:
    if by == "length":
        return str(key)
    if len(bases) == 1:
        return f"{fmt_multiple(float(key))}\n{round(float(key) * next(iter(bases)))}"
    return fmt_multiple(float(key))


def describe_protocol(results: Sequence[Result]) -> str:
    """'nonoverlap' or 'sliding, stride L/2' / 'stride 64', from the entries themselves."""
    entries = [e for r in results for e in r["entries"]]
    protocols = sorted({e["protocol"] for e in entries})
    if protocols == ["streaming"]:
        caches = sorted({(e.get("window"), e.get("sinks"), e["stride"]) for e in entries}, key=str)
        return "; ".join(f"streaming, window {w}, {n} sinks, blocks of {s}" for w, n, s in caches)
    if protocols != ["sliding"]:
        return " + ".join(protocols) or "no entries"
    strides = {e["stride"] for e in entries}
    if all(e["stride"] == max(1, e["length"] // 2) for e in entries):
        return "sliding, stride L/2"
    if len(strides) == 1:
        return f"sliding, stride {next(iter(strides))}"
    return f"sliding, stride min({max(strides)}, L)"


def describe_lengths(results: Sequence[Result], key: str = "train_length") -> str:
    values = sorted({int(r[key]) for r in results})
    return "/".join(map(str, values))


def extrapolation_table(
    results: Sequence[Result],
    *,
    by: Literal["multiple", "length"] = "multiple",
    title: str | None = None,
    aggregate_by: Callable[[Result], str] | None = None,
    group_by: Callable[[Result], str] | None = None,
    label: Callable[[Result], str] = run_label,
) -> Table:
    """The eval-extrapolate table: perplexity per run and length, titled with protocol and training length."""
    columns, rows = extrapolation_rows(results, by=by, label=label, aggregate_by=aggregate_by, group_by=group_by)
    if title is None:
        title = (
            f"Perplexity by evaluation length · {describe_protocol(results)} · "
            f"trained at {describe_lengths(results)} tokens"
        )
    caption = extrapolation_caption(results, by, label)
    return render_table(columns, rows, title=title, caption=caption, label_header="run")


def extrapolation_caption(results: Sequence[Result], by: str, label: Callable[[Result], str] = run_label) -> str:
    tokens = sorted({e["tokens"] for r in results for e in r["entries"] if e.get("status") == "ok"})
    budget = f"{tokens[0]:,}" if len(tokens) == 1 else f"{tokens[0]:,}–{tokens[-1]:,}" if tokens else "0"
    cols = "columns: multiples of each run's base length (tokens below)" if by == "multiple" else "columns: tokens"
    lines = [
        f"Token-weighted perplexity over {budget} scored tokens per length; {cols}; "
        "bold = best per column, when ahead of the next by more than both seed spreads."
    ]
    lines.append(f"Measured in {describe_measurement(results)}.")
    lines.extend(reason_lines(results, label))
    return "\n".join(lines)


def reason_lines(results: Sequence[Result], label: Callable[[Result], str]) -> list[str]:
    """'n/a for LABEL at 256, 512: REASON' (n/m, nan: `cell_kind`) for every stored entry without a value; runs that
    share a label (the seeds of one row) give one line."""
    lines: list[str] = []
    for r in results:
        reasons: dict[tuple[str, str], list[str]] = {}
        for e in r["entries"]:
            if e.get("status") != "ok":
                key = (cell_kind(e), e.get("reason") or "no reason recorded")
                reasons.setdefault(key, []).append(str(e["length"]))
        for (kind, reason), lengths in reasons.items():
            line = f"{kind} for {label(r)} at {', '.join(lengths)}: {reason}"
            if line not in lines:
                lines.append(line)
    return lines


def describe_measurement(results: Sequence[Result]) -> str:
    """Precision and device of the measured entries, e.g. 'fp32 on cpu (AMD EPYC 7B13)'; results depend on both
    (bf16 rounds differently; kernels differ between CPUs and GPUs)."""
    measured = [e for r in results for e in r["entries"] if e.get("status") == "ok"]
    dtypes = sorted({str(e.get("dtype") or "unknown precision") for e in measured})
    devices = sorted({str(e.get("device") or "an unrecorded device") for e in measured})
    if not measured:
        return "nothing measured"
    return f"{' + '.join(dtypes)} on {' + '.join(devices)}"


def cost_table(rows: Sequence[dict[str, Any]], *, title: str = "Cost per run") -> Table:
    """Each run's cost (`costs.RunCost` as dicts): tokens and seconds trained (a derived run's fine-tune), seconds
    of the scaling itself, and evaluation seconds at the longest length; '–' where not recorded."""
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("run", no_wrap=True, overflow="ellipsis", max_width=LABEL_MAX_WIDTH)
    for header in ("train / fine-tune tokens", "train / fine-tune s", "extend s", "eval s at longest"):
        table.add_column(header, justify="right")
    for row in rows:
        longest = row.get("eval_length")
        eval_s = row.get("eval_s")
        table.add_row(
            str(row["label"]),
            "–" if row.get("train_tokens") is None else f"{row['train_tokens']:,}",
            "–" if row.get("train_s") is None else f"{row['train_s']:.1f}",
            "–" if row.get("extend_s") is None else f"{row['extend_s']:.2f}",
            "–" if eval_s is None else f"{eval_s:.1f} (L={longest})",
        )
    return table
