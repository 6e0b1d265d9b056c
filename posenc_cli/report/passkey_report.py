"""Passkey results as a rich table and a heatmap figure (objects only; the CLI prints and saves them).

Input: the result documents of `posenc_cli.evaluation.tasks.passkey.evaluate_passkey_run` (`eval/passkey.json`), one
per run, and optionally each run's competence gate as (state, in-distribution accuracy) pairs (`evaluation.competence`,
computed by the caller: this layer reads no run): the table prints it beside the run (≤L) and the figure hatches the
panel of a run that did not learn the task or never trained on it (`report.gate`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.table import Table
from rich.text import Text

from posenc_cli.report.colours import accuracy_style, ink_colour
from posenc_cli.report.gate import DEFAULT_COMPETENCE, gate_cell, gate_legend, gate_note, mark_panel
from posenc_cli.report.tables import LABEL_MAX_WIDTH, describe_lengths, fit_to_content, run_label

Gate = tuple[str, float | None]  # (competence state, in-distribution accuracy) of one run

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def accuracy_grid(
    result: dict[str, Any], metric: str = "accuracy"
) -> tuple[list[tuple[int, float]], list[float], np.ndarray, dict[str, str]]:
    """((length, multiple) rows, depth columns, (rows, cols) `metric` with NaN for n/a, {reason: lengths})."""
    rows = sorted({(int(e["length"]), float(e["multiple"])) for e in result["entries"]})
    cols = sorted({float(e["depth"]) for e in result["entries"]})
    grid = np.full((len(rows), len(cols)), np.nan)
    reasons: dict[str, dict[str, None]] = {}  # reason -> lengths (ordered set)
    for e in result["entries"]:
        i, j = rows.index((int(e["length"]), float(e["multiple"]))), cols.index(float(e["depth"]))
        if e.get("status") == "ok" and e.get(metric) is not None:
            grid[i, j] = float(e[metric])
        else:
            reasons.setdefault(e.get("reason") or "not measured", {})[str(e["length"])] = None
    return rows, cols, grid, {r: ", ".join(lengths) for r, lengths in reasons.items()}


def _depth_label(depth: float) -> str:
    return f"{depth * 100:g}%"


def _length_label(length: int, multiple: float) -> str:
    return f"{multiple:g}× · {length}"


def passkey_table(
    results: Sequence[dict[str, Any]], gates: Sequence[Gate] | None = None, competence: float = DEFAULT_COMPETENCE
) -> Table:
    """Rows = run × length, columns = depths and their mean; cells coloured by accuracy, n/a dimmed. With `gates`
    (one per result), a "≤L" column on each run's first row: its accuracy at lengths up to the training length and
    the competence gate's verdict at `competence`."""
    cols = sorted({float(e["depth"]) for r in results for e in r["entries"]})
    trials = sorted({int(e["trials"]) for r in results for e in r["entries"]})
    table = Table(
        title=f"Passkey retrieval accuracy · trained at {describe_lengths(results)} tokens",
        title_justify="left",
        caption_justify="left",
        header_style="bold",
    )
    table.add_column("run", no_wrap=True, overflow="ellipsis", max_width=LABEL_MAX_WIDTH)
    table.add_column("length \\ depth", justify="right", no_wrap=True)
    for d in cols:
        table.add_column(_depth_label(d), justify="center", no_wrap=True)
    table.add_column("mean", justify="right")
    table.add_column("digits", justify="right")
    if gates is not None:
        table.add_column("≤L", justify="right", no_wrap=True)
    notes = []
    for n, r in enumerate(results):
        if n:
            table.add_section()
        rows, rcols, grid, reasons = accuracy_grid(r)
        partial = accuracy_grid(r, "token_accuracy")[2]
        for i, (length, multiple) in enumerate(rows):
            cells: list[Text | str] = [run_label(r) if i == 0 else "", _length_label(length, multiple)]
            for d in cols:
                value = grid[i, rcols.index(d)] if d in rcols else math.nan
                if math.isnan(value):
                    cells.append(Text("n/a", style="dim"))
                else:
                    style = accuracy_style(value)
                    cells.append(Text(f" {value:.0%} ", style=style))
            for values in (grid[i], partial[i]):
                full = values.size > 0 and not np.isnan(values).any()
                cells.append(f"{values.mean():.0%}" if full else Text("n/a", style="dim"))
            if gates is not None:
                cells.append(gate_cell(*gates[n]) if i == 0 else "")
            table.add_row(*cells)
        notes += [f"n/a for {run_label(r)} at {lengths}: {reason}" for reason, lengths in reasons.items()]
    count = "/".join(map(str, trials)) or "0"
    table.caption = "\n".join(
        [
            f"Exact match of the greedily decoded key over {count} trials per cell; columns: key depth (share of "
            "the filler before the key); rows: prompt + answer tokens (multiple of each run's base length); "
            "digits: share of answer tokens right at their position (partial credit), mean over depths.",
            *([f"≤L: accuracy at lengths up to the training length. {gate_note(competence)}"] if gates else []),
            *notes,
        ]
    )
    return fit_to_content(table)


def passkey_figure(
    results: Sequence[dict[str, Any]], gates: Sequence[Gate] | None = None, competence: float = DEFAULT_COMPETENCE
) -> Figure:
    """One accuracy heatmap per run (lengths × depths, RdYlGn from 0 to 1, n/a grey), one shared colour bar; with
    `gates`, the panel of a run flagged by the competence gate is hatched over, with a legend entry."""
    # deferred: keeps matplotlib off posenc --help start-up
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = max(len(results), 1)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(3.6 * ncols + 1.2, 2.9 * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    image = None
    for k, ax in enumerate(axes.flat):
        if k >= len(results):
            ax.set_axis_off()
            continue
        rows, cols, grid, _ = accuracy_grid(results[k])
        image = ax.imshow(np.ma.masked_invalid(grid), cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_facecolor("0.85")
        for (i, j), value in np.ndenumerate(grid):
            text = "n/a" if math.isnan(value) else f"{value:.0%}"
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=8,
                color="0.3" if math.isnan(value) else ink_colour(value),
            )
        ax.set_xticks(range(len(cols)), [_depth_label(d) for d in cols])
        ax.set_yticks(range(len(rows)), [_length_label(length, m) for length, m in rows])
        ax.set_xlabel("key depth")
        if k % ncols == 0:
            ax.set_ylabel("length (multiple · tokens)")
        ax.set_title(run_label(results[k]), fontsize=10)
        if gates is not None:
            mark_panel(ax, gates[k][0])
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), label="exact-match accuracy", shrink=0.9)
    gate_legend(fig, [g[0] for g in gates or []], competence)
    fig.suptitle(f"Passkey retrieval (trained at {describe_lengths(results) if results else '?'} tokens)")
    return fig
