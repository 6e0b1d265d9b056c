"""The cost-curve figure: time per token and peak memory against evaluation length, log-log, one line per scheme
(colours from `report.plots.scheme_colour`, so a scheme looks the same in every posenc plot)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

from posenc_cli.perf.cost_curve import MEASURED
from posenc_cli.report.plots import SCHEME_COLOURS, scheme_colour

_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def cost_curve_figure(result: dict[str, Any], *, title: str | None = None) -> Figure:
    """Two panels: µs per token and peak memory (MiB) against length (log₂ x, log y); only measured cells are
    drawn. A line that stops before the longest length ends where its scheme was not (or could not be) measured."""
    fig = Figure(figsize=(13, 5.2), layout="constrained")
    FigureCanvasAgg(fig)
    time_ax, mem_ax = fig.subplots(1, 2)
    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in result["rows"]:
        if r["status"] == MEASURED:
            series[r["scheme"]].append(r)
    for i, scheme in enumerate(result["schemes"]):
        points = sorted(series.get(scheme, []), key=lambda r: r["length"])
        if not points:
            continue
        ls = "-" if scheme in SCHEME_COLOURS else "--"  # fallback colours may repeat: dashes tell them apart
        style = {"color": scheme_colour(scheme), "marker": _MARKERS[i % len(_MARKERS)], "ls": ls, "lw": 1.6, "ms": 4}
        x = [r["length"] for r in points]
        time_ax.plot(x, [r["us_per_token"] for r in points], label=scheme, **style)
        mem_ax.plot(x, [r["peak_mib"] for r in points], label=scheme, **style)
    limit = result.get("memory_limit_applied_gib")
    peak = max((r["peak_mib"] for rows in series.values() for r in rows), default=0.0)
    if limit and peak > limit * 1024 / 8:  # drawn when near the data; else named in the legend's title
        mem_ax.axhline(limit * 1024, color="0.35", ls=":", lw=1.2, label=f"memory limit ({limit:g} GiB)")
    lengths = sorted(result["lengths"])
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for ax, label in (
        (time_ax, "time per token (µs, log scale)"),
        (mem_ax, f"peak memory (MiB, log scale): {_mem(result)}"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlim(lengths[0] / 1.25, lengths[-1] * 1.25)  # every length asked, measured or not
        ax.xaxis.set_major_locator(FixedLocator(lengths))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([_k(n) for n in lengths])
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain if _decades(ax) < 1.5 else NullFormatter())  # label minors if few majors
        ax.set_xlabel("evaluation length (tokens, log₂ scale)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    mem_ax.legend(
        fontsize="small",
        title=f"memory limit {limit:g} GiB" if limit and peak <= limit * 1024 / 8 else None,
        title_fontsize="small",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
        frameon=False,
    )
    fig.suptitle(title or describe(result))
    return fig


def describe(result: dict[str, Any]) -> str:
    """'Eval forward cost, batch 1: model d=128, 4 layers; fp32; cpu (...), 2 threads'."""
    c = result["config"]
    n = result.get("threads")
    where = result["device"] + (f", {n} thread{'s' if n != 1 else ''}" if n else "")
    return (
        f"Evaluation forward, batch 1: d={c['d_model']}, {c['n_layer']} layers, {c['n_head']} heads, "
        f"{result['precision']}; {where}"
    )


def _decades(ax: Any) -> float:
    lo, hi = ax.get_ylim()
    return math.log10(hi / lo) if lo > 0 else 99.0


def _mem(result: dict[str, Any]) -> str:
    return "resident set" if result.get("memory_measure", "").startswith("peak resident") else "allocated"


def _k(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)
