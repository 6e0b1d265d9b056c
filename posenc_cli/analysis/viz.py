"""Figures of `posenc viz` (matplotlib object API on the Agg canvas) and its compact terminal grid (rich).

The arrays come from `posenc_cli.analysis.viz_data`; this module only draws them. Each scheme keeps its colour from
`plots.scheme_colour`, so a scheme looks the same here as in every other posenc plot.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, to_rgb
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
from rich.table import Table
from rich.text import Text

from posenc_cli.analysis.viz_data import (
    AttentionPanel,
    AttentionReport,
    BiasData,
    EncodingData,
    LayoutEncoding,
    RotaryData,
    attention_report,
    layers_text,
)
from posenc_cli.evaluation.corpus import CorpusCache
from posenc_cli.evaluation.runs import find_runs
from posenc_cli.report.plots import log_binned_mean, save_figure, scheme_colour
from posenc_cli.report.tables import run_label
from posenc_cli.run.device import resolve_device
from posenc_cli.run.load import load_run

TRAIN_LINE = {"color": "0.3", "ls": "--", "lw": 1.1}
MASKED = "#EEEEEE"  # background of cells the causal mask hides


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def shades(colour: str, n: int) -> list[tuple[float, float, float]]:
    """n shades of one colour, light to dark, so lines of one scheme stay in its colour but remain distinguishable."""
    rgb = np.array(to_rgb(colour))
    light, dark = rgb + (1 - rgb) * 0.6, rgb * 0.45
    out = []
    for t in np.linspace(0.0, 1.0, n) if n > 1 else [0.5]:
        mix = light + (rgb - light) * 2 * t if t <= 0.5 else rgb + (dark - rgb) * (2 * t - 1)
        out.append((float(mix[0]), float(mix[1]), float(mix[2])))
    return out


def _symmetric(values: np.ndarray) -> float:
    finite = np.abs(values[np.isfinite(values)])
    return float(finite.max()) if finite.size and finite.max() > 0 else 1.0


def _cmap(name: str) -> Any:
    # deferred: keeps matplotlib off posenc --help start-up
    from matplotlib import colormaps

    return colormaps[name].with_extremes(bad=MASKED)


def _log2_axis(ax: Any, longest: int, axis: str = "x") -> None:
    """symlog base-2 axis from 0 to `longest` with ticks 0, 1, 2, 4, ... (as in `plots.per_position_figure`)."""
    getattr(ax, f"set_{axis}scale")("symlog", base=2, linthresh=1, linscale=0.5)
    top = int(math.log2(max(longest, 1)))
    step = 1 if top <= 9 else 2  # at most about 10 labels
    ticks = [0] + [2**k for k in range(top % step, top + 1, step)]
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(FixedLocator(ticks))
    target.set_minor_locator(NullLocator())
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


# ----------------------------------------------------------------------------------------------------------------
# Encodings.


def _describe(data: EncodingData) -> str:
    hooks = ", ".join(data.hooks) if data.hooks else "no hook"
    return (
        f"pos={data.scheme} ({hooks}; {data.source}) · d_model {data.d_model}, {data.n_head} heads × {data.head_dim}"
        f" · positions 0–{data.length - 1}, trained at {data.train_length}"
    )


def _zero_note(values: np.ndarray, data: EncodingData) -> str:
    """A title suffix for a hook that adds exactly zero here (e.g. CoPE's zero-initialised embeddings)."""
    finite = values[np.isfinite(values)]
    return f"\nzero everywhere: {data.source.split(';')[0]}" if finite.size and not finite.any() else ""


def _train_length_hline(ax: Any, data: EncodingData) -> None:
    if data.train_length < data.length:
        ax.axhline(data.train_length - 0.5, **TRAIN_LINE)
        ax.annotate(
            "training length",
            xy=(0.99, data.train_length - 0.5),
            xycoords=("axes fraction", "data"),
            ha="right",
            va="bottom",
            fontsize="small",
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8},
        )


def _draw_additive(fig: Figure, axes: Sequence[Any], data: EncodingData) -> None:
    grid = data.additive
    assert grid is not None
    ax, ax2 = axes
    v = _symmetric(grid)
    im = ax.imshow(grid, aspect="auto", cmap=_cmap("RdBu_r"), vmin=-v, vmax=v, interpolation="nearest")
    fig.colorbar(im, ax=ax, label="value added (zero-centred)")
    ax.set_xlabel("embedding dimension")
    ax.set_ylabel("position")
    ax.set_title("embed hook: what is added to the token embeddings" + _zero_note(grid, data))
    _train_length_hline(ax, data)
    unit = grid / np.maximum(np.linalg.norm(grid, axis=1, keepdims=True), 1e-30)
    im2 = ax2.imshow(unit @ unit.T, aspect="equal", cmap=_cmap("RdBu_r"), vmin=-1, vmax=1, interpolation="nearest")
    fig.colorbar(im2, ax=ax2, label="cosine similarity")
    ax2.set_xlabel("position j")
    ax2.set_ylabel("position i")
    ax2.set_title("similarity of the added vectors of positions i and j")


def _draw_rotary(fig: Figure, axes: Sequence[Any], data: EncodingData, colour: str) -> None:
    rot = data.rotary
    assert rot is not None
    ax, ax2 = axes
    wrapped = np.angle(np.exp(1j * rot.angles))  # (T, P) in (−π, π]
    im = ax.imshow(wrapped, aspect="auto", cmap=_cmap("twilight_shifted"), vmin=-np.pi, vmax=np.pi)
    bar = fig.colorbar(im, ax=ax, label="angle mod 2π (rad)", ticks=[-np.pi, -np.pi / 2, 0, np.pi / 2, np.pi])
    bar.ax.set_yticklabels(["−π", "−π/2", "0", "π/2", "π"])
    rates = rot.angles[1] - rot.angles[0] if len(rot.angles) > 1 else np.zeros(len(rot.pairs))
    ax.set_xlabel(
        f"frequency pair k of {len(rot.pairs)} (θ from {rates[0]:.3g} to {rates[-1]:.2g} rad/token)"
        if len(rates)
        else "frequency pair k"
    )
    ax.set_ylabel("position p")
    ax.set_title(f"rotate hook: rotation angle p·θ_k of each pair (head {rot.head})")
    _train_length_hline(ax, data)
    distance = np.arange(len(rot.similarity))
    ax2.plot(distance, rot.similarity, color=colour, lw=1.6)
    ax2.axhline(0.0, color="0.6", lw=0.8)
    if data.train_length < data.length:
        ax2.axvline(data.train_length, label="training length", **TRAIN_LINE)
        ax2.legend(fontsize="small", loc="upper right", frameon=False)
    ax2.set_xlabel("relative distance i − j (tokens)")
    ax2.set_ylabel("q·k / head dim")
    ax2.set_xlim(0, len(distance) - 1)
    ax2.set_title("resulting q·k of identical all-ones q and k vs distance")
    ax2.grid(True, alpha=0.3)


def _draw_bias(fig: Figure, axes: Sequence[Any], data: EncodingData, colour: str) -> None:
    b = data.bias
    assert b is not None
    ax, ax2 = axes
    random_note = " (random q, k ~ N(0, 1): one draw)" if b.content_dependent else ""
    distance = np.arange(b.by_distance.shape[1])
    for h, c in zip(range(b.by_distance.shape[0]), shades(colour, b.by_distance.shape[0]), strict=True):
        ax.plot(distance, b.by_distance[h], color=c, lw=1.5, label=f"head {h}")
    if data.train_length < data.length:
        ax.axvline(data.train_length, label="training length", **TRAIN_LINE)
    ax.set_xlabel("relative distance i − j (tokens)")
    ax.set_ylabel("bias added to the attention score")
    ax.set_xlim(0, len(distance) - 1)
    ax.set_title(
        f"bias hook vs distance, query at position {data.length - 1}, layer {b.layer}{random_note}"
        + _zero_note(b.by_distance, data)
    )
    ax.grid(True, alpha=0.3)
    ncol = 1 if b.by_distance.shape[0] <= 8 else 2
    ax.legend(fontsize="x-small", ncol=ncol, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    v = _symmetric(b.matrix)
    m = len(b.matrix)
    im = ax2.imshow(b.matrix, cmap=_cmap("RdBu_r"), vmin=-v, vmax=v, interpolation="nearest", extent=(0, m, m, 0))
    fig.colorbar(im, ax=ax2, label="bias (grey: masked)")
    ax2.set_xlabel("key position j")
    ax2.set_ylabel("query position i")
    ax2.set_title(f"(i, j) bias of head {b.head}, positions 0–{m - 1}{random_note}")


def _draw_nothing(ax: Any, data: EncodingData) -> None:
    n = min(data.length, 32)
    mask = np.where(np.tril(np.ones((n, n))) > 0, 1.0, np.nan)
    ax.imshow(mask, cmap=_cmap("Greys"), vmin=0, vmax=2, interpolation="nearest", extent=(0, n, n, 0))
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    ax.set_title(f"{nothing_to_draw(data, wrap=True)}\n(dark: query i may attend to key j; first {n} positions)",
                 fontsize="medium")  # fmt: skip


def nothing_to_draw(data: EncodingData, wrap: bool = False) -> str:
    """Why a scheme has no encoding picture: no hook at all (order only through the causal mask), or hooks that read
    the content (positions computed from the tokens, drawn only from a trained run's attention)."""
    sep = "\n" if wrap else " "
    if data.hooks:
        return (f"pos={data.scheme} computes its positions from the content ({', '.join(data.hooks)}):{sep}no fixed "
                f"encoding to draw; a trained run's attention by distance:{sep}posenc viz RUN")  # fmt: skip
    return (f"pos={data.scheme} uses no embed, rotate or bias hook: there is no encoding to draw;{sep}"
            "order enters only through the causal mask.")  # fmt: skip


def _parts(data: EncodingData) -> list[str]:
    return [p for p in ("additive", "rotary", "bias") if getattr(data, p) is not None]


def _draw_encoding(fig: Any, data: EncodingData) -> None:
    """The panels of `data` into `fig` (a figure or subfigure): two per hook used, else the causal-mask panel."""
    colour = scheme_colour(data.scheme)
    parts = _parts(data)
    if not parts:
        _draw_nothing(fig.add_subplot(), data)
        return
    grid = fig.add_gridspec(len(parts), 2, width_ratios=[1.25, 1])
    for row, part in enumerate(parts):
        axes = [fig.add_subplot(grid[row, 0]), fig.add_subplot(grid[row, 1])]
        if part == "additive":
            _draw_additive(fig, axes, data)
        elif part == "rotary":
            _draw_rotary(fig, axes, data, colour)
        else:
            _draw_bias(fig, axes, data, colour)


def encoding_figure(data: EncodingData) -> Figure:
    """One row of two panels per hook the scheme uses; a causal-mask panel for schemes without hooks."""
    parts = _parts(data)
    fig = _figure(14, 5.2 * len(parts)) if parts else _figure(9, 8)
    _draw_encoding(fig, data)
    paper = f"\n{data.paper}" if data.paper and parts else ""
    fig.suptitle(_describe(data) + paper, fontsize="medium")
    return fig


def section_title(data: EncodingData, layout: str) -> str:
    """'layers 0–2 of pos=irope: rope' (with its options when they differ from the scheme's defaults)."""
    options = f" ({data.options})" if data.options else ""
    return f"{layers_text(data.layers)} of pos={layout}: {data.scheme}{options}"


def _draw_spans(fig: Any, enc: LayoutEncoding) -> None:
    """One mask per sliding or chunked span, then one curve per query temperature, side by side."""
    n_panels = len(enc.spans) + (1 if enc.temperatures else 0)
    axes = fig.subplots(1, n_panels, squeeze=False)[0]
    for ax, pic in zip(axes, enc.spans, strict=False):
        n = len(pic.mask)
        ax.imshow(pic.mask, cmap=_cmap("Greys"), vmin=0, vmax=2, interpolation="nearest", extent=(0, n, n, 0))
        ax.set_xlabel("key position j")
        ax.set_ylabel("query position i")
        ax.set_title(f"{pic.span.describe()} span of {layers_text(pic.layers)}\n(dark: query i may attend to key j)")
    if enc.temperatures:
        ax = axes[-1]
        for pic, c in zip(enc.temperatures, shades("#444444", len(enc.temperatures)), strict=True):
            t = pic.temperature
            ax.step(np.arange(len(pic.factor)), pic.factor, where="post", color=c, lw=1.6,
                    label=f"{layers_text(pic.layers)}: a={t.scale:g}, F={t.floor}")  # fmt: skip
        if enc.train_length < enc.length:
            ax.axvline(enc.train_length, label="training length", **TRAIN_LINE)
        ax.set_xlabel("token index n")
        ax.set_ylabel("factor on q")
        ax.set_title("floor-log query temperature 1 + a·log1p(⌊(n + 1)/F⌋)")
        ax.legend(fontsize="small", frameon=False)
        ax.grid(True, alpha=0.3)


def layout_figure(enc: LayoutEncoding) -> Figure:
    """A layout's encodings: one block per distinct scheme (its hooks' panels, titled with the layers that use it),
    then the masks of its sliding or chunked spans and its query temperatures."""
    heights = [max(1, len(_parts(d))) * 5.2 for d in enc.sections]
    if enc.spans or enc.temperatures:
        heights.append(4.6)
    fig = _figure(14, sum(heights) + 1.0)
    subs = fig.subfigures(len(heights), 1, height_ratios=heights, squeeze=False)[:, 0]
    for sub, data in zip(subs, enc.sections, strict=False):
        _draw_encoding(sub, data)
        sub.suptitle(section_title(data, enc.layout), fontsize="medium", fontweight="bold")
    if enc.spans or enc.temperatures:
        _draw_spans(subs[-1], enc)
        title = f"attention spans and query temperatures of pos={enc.layout}"
        subs[-1].suptitle(title, fontsize="medium", fontweight="bold")
    first = enc.sections[0]
    fig.suptitle(
        f"pos={enc.layout}, a per-layer layout ({first.source}) · d_model {first.d_model}, {first.n_head} heads × "
        f"{first.head_dim} · positions 0–{enc.length - 1}, trained at {enc.train_length}"
        + (f"\n{enc.paper}" if enc.paper else ""),
        fontsize="medium",
    )
    return fig


# ----------------------------------------------------------------------------------------------------------------
# Terminal grid.


def _cell(value: float, vmax: float, fmt: str) -> Text:
    """A number on a background whose hue is its sign (red +, blue −) and whose strength is |value| / vmax."""
    t = min(1.0, abs(value) / vmax) if vmax > 0 else 0.0
    base = (214, 96, 77) if value >= 0 else (67, 147, 195)
    rgb = tuple(round(255 + (c - 255) * t) for c in base)
    ink = "white" if t > 0.6 else "black"
    shown = fmt.format(value)
    if float(shown) == 0.0:
        shown = fmt.format(0.0)  # no "−0.00"
    return Text(shown, style=f"{ink} on rgb({rgb[0]},{rgb[1]},{rgb[2]})", justify="right")


def _grid_table(values: np.ndarray, title: str, row_name: str, col_name: str) -> Table:
    vmax = _symmetric(values)
    exponent = math.floor(math.log10(vmax)) if vmax < 0.1 else 0
    scaled = values / 10.0**exponent
    fmt = "{:+.2f}" if _symmetric(scaled) < 10 else "{:+.1f}"
    caption = f"values × 1e{exponent}" if exponent else None
    table = Table(title=title, caption=caption, show_edge=False, pad_edge=False, padding=(0, 1))
    table.add_column(f"{row_name} \\ {col_name}", justify="right", style="dim")
    for j in range(values.shape[1]):
        table.add_column(str(j), justify="right")
    for i in range(values.shape[0]):
        table.add_row(str(i), *(_cell(float(v), vmax / 10.0**exponent, fmt) for v in scaled[i]))
    return table


def terminal_grids(data: EncodingData, size: int = 8) -> list[Any]:
    """The classic small grid per hook (first `size` positions × dims / pairs / heads) as rich renderables."""
    out: list[Any] = []
    if data.additive is not None:
        out.append(
            _grid_table(data.additive[:size, :size], f"{data.scheme}: added to the embeddings", "position", "dim")
        )
    if data.rotary is not None:
        r: RotaryData = data.rotary
        wrapped = np.angle(np.exp(1j * r.angles[:size, :size]))
        out.append(_grid_table(wrapped, f"{data.scheme}: rotation angle mod 2π (rad)", "position", "pair"))
    if data.bias is not None:
        b: BiasData = data.bias
        note = ", random q/k" if b.content_dependent else ""
        out.append(_grid_table(b.by_distance[:size, :size].T, f"{data.scheme}: score bias{note}", "distance", "head"))
    if data.empty:
        out.append(Text(nothing_to_draw(data)))
    return out


def layout_terminal(enc: LayoutEncoding, size: int = 8) -> list[Any]:
    """Each layer's scheme, span and temperature, then each distinct scheme's grids under the layers using it."""
    out: list[Any] = [Text(f"pos={enc.layout}: " + "; ".join(enc.layer_lines))]
    for data in enc.sections:
        out.append(Text(section_title(data, enc.layout), style="bold"))
        out.extend(terminal_grids(data, size))
    return out


# ----------------------------------------------------------------------------------------------------------------
# Attention of trained runs.


def _run_title(report: AttentionReport) -> str:
    """`rope-0 (rope)`; a sweep job named `pos=rope` already names its scheme; a DroPE run says its model attends
    without positions (`rope-0 (rope), positions dropped at 3500`)."""
    title = (
        report.run
        if report.run.endswith(f"={report.scheme}")
        else run_label({"run": report.run, "scheme": report.scheme})
    )
    return title if report.dropped_at is None else f"{title}, positions dropped at {report.dropped_at}"


def _mult(m: float) -> str:
    return f"{m:g}×"


def _head_label(h: int) -> str:
    return "mean of heads" if h < 0 else f"head {h}"


def _draw_map(
    ax: Any, panel: AttentionPanel, key: tuple[int, int], train_length: int, norm: Any, note: str = ""
) -> Any:
    layer, head = key
    what = f"layer {layer} · {_head_label(head)}" + (f"\n{textwrap.shorten(note, 44)}" if note else "")
    title = f"{what}\nL = {panel.length} ({_mult(panel.multiple)} training length)"
    ax.set_box_aspect(1)
    if panel.status != "ok":
        reason = textwrap.fill(str(panel.reason), 22)
        ax.text(0.5, 0.5, f"n/a\n\n{reason}", ha="center", va="center", fontsize="medium", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(title, fontsize="small")
        return None
    T = panel.length
    m = np.where(np.isfinite(panel.maps[key]), np.maximum(panel.maps[key], norm.vmin), np.nan)
    im = ax.imshow(m, cmap=_cmap("magma_r"), norm=norm, interpolation="nearest", extent=(0, T, T, 0))
    if train_length < T:  # keys at distance ≥ training length were never seen in training
        ax.plot([0, T - train_length], [train_length, T], color="#00B4D8", ls="--", lw=1.6)
    ax.set_title(title, fontsize="small")
    ax.set_xlabel("key position j", fontsize="small")
    ax.set_ylabel("query position i", fontsize="small")
    ax.tick_params(labelsize="x-small")
    return im


def _draw_weight(ax: Any, report: AttentionReport, *, per_layer: bool = True, smooth: int = 4) -> None:
    """Mean attention weight by distance: one line per layer (or their mean) and length; 1× solid, longer dashed."""
    colour = scheme_colour(report.scheme)
    longest = max(p.length for p in report.panels)
    colours = shades(colour, report.n_layer) if per_layer else [to_rgb(colour)]
    styles = ("-", "--", ":", "-.")
    for i, panel in enumerate(report.panels):
        ls = styles[i % len(styles)]
        if panel.status != "ok" or panel.mass is None:
            ax.plot([], [], color="0.5", ls=ls, label=f"L = {panel.length} ({_mult(panel.multiple)}): n/a")
            continue
        weight = panel.weight_by_distance()
        curves = weight.mean(1) if per_layer else weight.mean((0, 1))[None]  # (n, T)
        means = panel.mean_distance() if per_layer else [float(panel.mean_distance().mean())]
        for layer, (curve, c) in enumerate(zip(curves, colours, strict=True)):
            x, y = log_binned_mean(np.arange(len(curve)), curve, smooth)
            who = f"layer {layer}, " if per_layer else ""
            label = f"{who}L = {panel.length} ({_mult(panel.multiple)}), mean distance {means[layer]:.1f}"
            ax.plot(x, y, color=c, ls=ls, lw=1.6, label=label)
    ax.axvline(report.train_length, label=f"training length {report.train_length}", **TRAIN_LINE)
    _log2_axis(ax, longest)
    ax.set_xlim(0, longest)
    ax.set_yscale("log")
    ax.grid(True, which="major", alpha=0.3)


def attention_figure(report: AttentionReport, *, pairs_per_row: int = 2) -> Figure:
    """Maps of the selected layers and heads (training length next to the longer length) and weight by distance."""
    keys = [(layer, h) for layer in report.layers for h in report.heads]
    n_len = len(report.panels)
    per_row = max(1, min(pairs_per_row, len(keys)))
    nrows = -(-len(keys) // per_row)
    ncols = per_row * n_len
    fig = _figure(max(11.0, 3.3 * ncols + 1.5), 3.3 * nrows + 4.4)
    grid = fig.add_gridspec(nrows + 1, ncols, height_ratios=[1.0] * nrows + [1.25])
    norm = LogNorm(vmin=1e-4, vmax=1.0)
    image = None
    map_axes = []
    for k, key in enumerate(keys):
        row, col = divmod(k, per_row)
        for j, panel in enumerate(report.panels):
            ax = fig.add_subplot(grid[row, n_len * col + j])
            map_axes.append(ax)
            note = report.layer_notes[key[0]] if report.layer_notes else ""
            image = _draw_map(ax, panel, key, report.train_length, norm, note) or image
    if image is not None:
        fig.colorbar(image, ax=map_axes, label="attention weight (log scale)", shrink=0.8, aspect=30)
    ax = fig.add_subplot(grid[nrows, :])
    _draw_weight(ax, report)
    ax.set_xlabel("distance i − j from the query (tokens, log₂ scale)")
    ax.set_ylabel("mean attention weight")
    ax.set_title(
        "How far each layer looks: mean attention weight at each distance (mean of heads, of the queries that "
        "reach it, and of log₂ bins)",
        fontsize="medium",
    )
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ok = [p for p in report.panels if p.status == "ok"]
    n_windows = max((p.windows for p in ok), default=0)
    pooled = [p for p in ok if p.pool > 1]
    note = f" (L = {pooled[-1].length} pooled in {pooled[-1].pool}-token blocks)" if pooled else ""
    label = _run_title(report)
    fig.suptitle(
        f"{label}, trained at L = {report.train_length}: attention on held-out validation text\n"
        f"maps: first window{note}; distances: {n_windows} windows; dashed cyan: distance = training length",
        fontsize="medium",
    )
    return fig


def compare_figure(reports: Sequence[AttentionReport], *, ncols: int = 4) -> Figure:
    """One small panel per run: share of attention mass by distance (mean of layers and heads), 1× vs longer."""
    if not reports:
        raise ValueError("compare_figure needs at least one report")
    nrows = -(-len(reports) // ncols)
    ncols = -(-len(reports) // nrows)  # balanced rows: 5 runs -> 3 + 2, not 4 + 1
    fig = _figure(3.9 * ncols + 0.5, 3.3 * nrows + 0.9)
    axes = fig.subplots(nrows, ncols, sharey=True, squeeze=False)
    for ax, report in zip(axes.flat, reports, strict=False):
        _draw_weight(ax, report, per_layer=False)
        label = _run_title(report)
        ax.set_title(f"{label}, trained at {report.train_length}", fontsize="small", color=scheme_colour(report.scheme))
        ax.legend(fontsize="xx-small", loc="lower left", frameon=False)
    for ax in axes.flat[len(reports) :]:
        ax.set_visible(False)
    for ax in axes.flat:
        ax.set_xlabel("distance i − j (tokens, log₂)", fontsize="small")
    for ax in axes[:, 0]:
        ax.set_ylabel("mean attention weight", fontsize="small")
    multiples = sorted({_mult(p.multiple) for r in reports for p in r.panels})
    fig.suptitle(
        f"Mean attention weight by distance at {' and '.join(multiples)} the training length "
        "(mean of layers, heads and queries; held-out validation windows)",
        fontsize="medium",
    )
    return fig


def write_attention_comparison(
    paths: Sequence[Path | str],
    out: Path | str,
    *,
    multiple: float = 4.0,
    windows: int = 4,
    device: str = "auto",
) -> Path:
    """For sweeps: load every run under `paths`, measure attention by distance at 1× and `multiple`×, save the PNG."""
    dev = resolve_device(device)
    corpora = CorpusCache()
    reports = []
    for run_dir in find_runs(paths):
        run = load_run(run_dir, device=dev)
        val = corpora.get(run.config.data, run).val
        reports.append(attention_report(run, multiple=multiple, maps=False, windows=windows, val=val))
    return save_figure(compare_figure(reports), out)
