"""Rich tables of evaluation results: eval-extrapolate's results as rows of `report.cells` (`extrapolation_rows`),
optionally aggregating several runs into one row and grouping rows into sections, the eval-extrapolate table and
caption, and the cost table. Results are the docs returned by `perplexity.evaluate_run` or read by
`results.load_results`. The generic table names (`Cell`, `render_table`, the marks) stay importable from here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

from rich.table import Table

from posenc_cli.report.cells import (
    CANNOT,
    LABEL_MAX_WIDTH,
    LABEL_WRAP_WIDTH,
    LEGEND,
    LONGPPL_LEGEND,
    NO_KEY_TOKENS,
    NON_FINITE,
    NOT_MEASURED,
    UNMEASURABLE,
    Cell,
    Column,
    TableRow,
    cell_kind,
    fit_to_content,
    fmt_cell,
    fmt_number,
    render_table,
    table_legend,
)

__all__ = [  # the generic names of `report.cells` too, for the modules that import them from here
    "CANNOT",
    "LABEL_MAX_WIDTH",
    "LABEL_WRAP_WIDTH",
    "LEGEND",
    "LONGPPL_LEGEND",
    "NON_FINITE",
    "NOT_MEASURED",
    "NULL_REASONS",
    "UNMEASURABLE",
    "Cell",
    "Column",
    "Result",
    "TableRow",
    "cell_kind",
    "column_key",
    "cost_table",
    "describe_lengths",
    "describe_measurement",
    "describe_protocol",
    "extrapolation_caption",
    "extrapolation_rows",
    "extrapolation_table",
    "fit_to_content",
    "fmt_cell",
    "fmt_multiple",
    "fmt_number",
    "ratio_header",
    "ratio_keys",
    "ratio_value",
    "reason_lines",
    "render_table",
    "run_label",
    "table_legend",
    "tokenizer_note",
]

Result = dict[str, Any]  # one run: {"run", "scheme", "train_length", "base_length", "entries": [...], ...}


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


def _mark_unrecorded(cell: Cell, entry: dict[str, Any], metric: str, train_length: int | None = None) -> None:
    """An ok entry without `metric`: n/a when it recorded null for a reason (`NULL_REASONS`), "none" for LongPPL
    beyond the training length with no key token, n/m when the field is absent (measured before the metric was
    recorded); the first member's reason and kind win."""
    if cell.reason is None:
        beyond = train_length is not None and int(entry["length"]) > int(train_length)
        if metric == "longppl" and beyond and entry.get("key_tokens") == 0:
            cell.reason, cell.kind = "no key tokens beyond the training length", NO_KEY_TOKENS
        elif metric in entry:
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
    one `results.cell_group` of a stored doc). Rows keep the order of first appearance; with `group_by` they are
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
            raise ValueError(f"{r['run']}: several entries per length; one protocol per row (results.cell_group)")
        for e in r["entries"]:
            cell = row.cells.setdefault(column_key(e, by), Cell())
            if e.get("status") == "ok" and e.get(metric) is not None:
                cell.values.append(float(e[metric]))
            elif e.get("status") != "ok":
                _mark_empty(cell, e, metric)
            elif metric in NULL_REASONS:  # ok, but without this optional metric: n/a or n/m
                _mark_unrecorded(cell, e, metric, r.get("train_length"))
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
    """The eval-extrapolate table: perplexity per run and length, titled with protocol and training length; bits
    per byte when the runs' tokenizers differ (`tokenizer_note`), since their tokens are different units."""
    note = tokenizer_note(results, label)
    metric = "bpb" if note else "ppl"
    columns, rows = extrapolation_rows(
        results, by=by, metric=metric, label=label, aggregate_by=aggregate_by, group_by=group_by
    )
    if title is None:
        title = (
            f"{'Bits per byte' if note else 'Perplexity'} by evaluation length · {describe_protocol(results)} · "
            f"trained at {describe_lengths(results)} tokens"
        )
    caption = "\n".join([*([note] if note else []), extrapolation_caption(results, by, label)])
    return render_table(columns, rows, title=title, caption=caption, label_header="run")


def tokenizer_note(results: Sequence[Result], label: Callable[[Result], str] = run_label) -> str:
    """Why a table of these results shows bits per byte: the measured runs use more than one tokenizer (each
    result's "tokenizer" {fingerprint, name}, `analysis.gather.labelled_in_order`); '' when they share one."""
    measured = [r for r in results if r["entries"] and (r.get("tokenizer") or {}).get("fingerprint")]
    by_fingerprint: dict[str, list[Result]] = {}
    for r in measured:
        by_fingerprint.setdefault(str(r["tokenizer"]["fingerprint"]), []).append(r)
    if len(by_fingerprint) < 2:
        return ""
    which = "; ".join(
        f"{rs[0]['tokenizer'].get('name') or fp[:8]}: {', '.join(dict.fromkeys(label(r) for r in rs))}"
        for fp, rs in by_fingerprint.items()
    )
    return (
        f"Bits per byte, not perplexity: the runs' tokenizers differ ({which}), so a per-token score counts "
        "different units; per byte compares them."
    )


def extrapolation_caption(results: Sequence[Result], by: str, label: Callable[[Result], str] = run_label) -> str:
    tokens = sorted({e["tokens"] for r in results for e in r["entries"] if e.get("status") == "ok"})
    budget = f"{tokens[0]:,}" if len(tokens) == 1 else f"{tokens[0]:,}–{tokens[-1]:,}" if tokens else "0"
    cols = "columns: multiples of each run's base length (tokens below)" if by == "multiple" else "columns: tokens"
    what = "Bits per byte" if tokenizer_note(results, label) else "Token-weighted perplexity"
    lines = [
        f"{what} over {budget} scored tokens per length; {cols}; "
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
