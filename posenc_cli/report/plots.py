"""Matplotlib figures of evaluation results (object API on the Agg canvas: no pyplot state, no display needed).

Every figure colours a run by its scheme from one fixed palette (`scheme_colour`), so "rope" is the same blue in
every plot posenc draws; runs sharing a scheme are told apart by marker and line style.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter, NullLocator

from posenc_cli.errors import ConfigError, UserError
from posenc_cli.report.output_files import check_writable_dir, staged_files
from posenc_cli.report.tables import CANNOT, cell_kind, describe_lengths, describe_protocol, run_label, tokenizer_note

Result = dict[str, Any]

# Colour-blind-friendly (Okabe–Ito / tab10) colours, fixed per scheme name so plots agree with each other.
SCHEME_COLOURS: dict[str, str] = {
    "rope": "#0072B2",
    "alibi": "#009E73",
    "sinusoidal": "#D55E00",
    "learned": "#CC79A7",
    "nope": "#555555",
    "t5": "#E69F00",
    "xpos": "#56B4E9",
    "fire": "#8C564B",
    "kerple": "#9467BD",
    "cope": "#BCBD22",
    "sandwich": "#332288",
    # per-layer layouts (Tol's muted palette, apart from the schemes' colours)
    "irope": "#882255",
    "rnope-swa": "#44AA99",
    "smollm3": "#DDCC77",
    "gemma3": "#117733",
    "layout": "#AA4499",
}
_FALLBACK = ("#17BECF", "#7F7F7F", "#AEC7E8", "#FF9896", "#98DF8A", "#C5B0D5", "#C49C94", "#F7B6D2")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_STYLES = ("-", "-.", ":", (0, (5, 1)))


def shown_label(result: Result) -> str:
    """The label the table gives the run (`analysis.gather.labelled_in_order`), else the run name with its scheme."""
    return str(result.get("label") or run_label(result))


def scheme_colour(scheme: str) -> str:
    """The fixed colour of a scheme; unknown names get a stable colour from a fallback palette."""
    return SCHEME_COLOURS.get(scheme) or _FALLBACK[zlib.crc32(scheme.encode()) % len(_FALLBACK)]


def _styles(results: Sequence[Result]) -> list[dict[str, Any]]:
    """Colour by scheme; the k-th run of the same scheme gets the k-th marker and line style."""
    seen: dict[str, int] = {}
    out = []
    for r in results:
        k = seen[r["scheme"]] = seen.get(r["scheme"], -1) + 1
        out.append({"color": scheme_colour(r["scheme"]), "marker": _MARKERS[k % len(_MARKERS)], "ls": _STYLES[k % 4]})
    return out


def _train_lines(ax: Any, results: Sequence[Result]) -> None:
    for i, length in enumerate(sorted({int(r["train_length"]) for r in results})):
        ax.axvline(length, color="0.35", ls="--", lw=1.2, zorder=1, label="training length" if i == 0 else None)


def ppl_vs_length_figure(results: Sequence[Result], *, title: str | None = None, metric: str | None = None) -> Figure:
    """Perplexity (log) vs evaluation length in tokens (log₂), one line per run; n/a lengths are left out. `metric`
    "bpb" draws bits per byte instead; None: bits per byte when the runs' tokenizers differ (`tokenizer_note`)."""
    if metric is None:
        metric = "bpb" if tokenizer_note(results) else "ppl"
    name = "bits per byte" if metric == "bpb" else "perplexity"
    fig = Figure(figsize=(9, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    lengths: set[int] = set()
    for r, style in zip(results, _styles(results), strict=True):
        ok = [e for e in sorted(r["entries"], key=lambda e: e["length"]) if e.get(metric) is not None]
        na = [e["length"] for e in r["entries"] if e.get(metric) is None and cell_kind(e) == CANNOT]  # the scheme's
        label = shown_label(r) + (f" — n/a from {min(na)}" if na else "")
        x = [e["length"] for e in ok]
        ax.plot(x, [e[metric] for e in ok], label=label, lw=1.8, ms=5, zorder=3, **style)
        lengths.update(e["length"] for e in r["entries"])
    _train_lines(ax, results)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    if lengths:
        ax.xaxis.set_major_locator(FixedLocator(sorted(lengths)))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(n) for n in sorted(lengths)])
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 104, 1.5, 2000 rather than 1.04×10²
    ax.yaxis.set_major_formatter(plain)
    lo, hi = ax.get_ylim()
    if hi / lo < 20:  # narrow range: evenly spaced round numbers, all labelled (log minor ticks leave gaps)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10]))
        ax.yaxis.set_minor_locator(NullLocator())
    else:
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("evaluation length (tokens, log₂ scale)")
    ax.set_ylabel(f"{name} (log scale)")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(
        title
        or f"{name.capitalize()} vs evaluation length ({describe_protocol(results)}; trained at "
        f"{describe_lengths(results)} tokens)"
    )
    _legend_outside(ax)
    return fig


def log_binned_mean(positions: np.ndarray, values: np.ndarray, per_octave: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Smooth a per-position curve for a log-scaled axis: mean of `values` in bins `per_octave` per doubling.

    Positions below about 1.4·per_octave keep their own bin (the early-token curse stays visible); further out a
    bin spans about position/per_octave tokens. Returns (mean position, mean value) per non-empty bin.
    """
    positions = np.asarray(positions, dtype=float)
    values = np.asarray(values, dtype=float)
    if per_octave <= 0 or len(values) == 0:
        return positions, values
    bins = np.floor(per_octave * np.log2(positions + 1)).astype(np.int64)  # (N,)
    _, inverse = np.unique(bins, return_inverse=True)
    counts = np.bincount(inverse)
    return np.bincount(inverse, weights=positions) / counts, np.bincount(inverse, weights=values) / counts


def per_position_series(result: Result) -> tuple[dict[str, Any], np.ndarray, np.ndarray] | None:
    """(entry, positions, mean loss) at the run's longest measured length; positions are 0-based in the window."""
    ok = [e for e in result["entries"] if e.get("status") == "ok" and e.get("per_position")]
    if not ok:
        return None
    e = max(ok, key=lambda e: e["length"])
    losses = np.asarray(e["per_position"], dtype=float)
    start = e["length"] - len(losses)  # sliding: only the last S positions are scored
    return e, np.arange(start, e["length"]), losses


def per_position_figure(results: Sequence[Result], *, smooth: int = 4, title: str | None = None) -> Figure:
    """Mean loss per position at the longest length, on a log₂ position axis, training length dashed.

    Raw per-position means are drawn faint; the bold curve averages them in `smooth` bins per doubling of the
    position (0 = no smoothing). A run that could not be measured that long (learned positions) shows its own
    longest curve, labelled so.
    """
    fig = Figure(figsize=(9, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    series = [(r, style, per_position_series(r)) for r, style in zip(results, _styles(results), strict=True)]
    longest = max((s[0]["length"] for _, _, s in series if s is not None), default=1)
    windows = sorted({_windows(s[0]) for _, _, s in series if s is not None and s[0]["length"] == longest})
    for r, style, s in series:
        if s is None:
            continue
        e, pos, loss = s
        label = shown_label(r) + ("" if e["length"] == longest else f" (only to L={e['length']})")
        if smooth:
            ax.plot(pos, loss, color=style["color"], lw=0.5, alpha=0.15, zorder=2)
        x, y = log_binned_mean(pos, loss, smooth)
        ax.plot(x, y, color=style["color"], ls=style["ls"], lw=1.8, label=label, zorder=3)
    _train_lines(ax, results)
    ax.set_xscale("symlog", base=2, linthresh=1, linscale=0.5)
    ticks = [0] + [2**k for k in range(int(np.log2(max(longest, 1))) + 1)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlim(0, longest)
    ax.set_xlabel("position in the evaluation window (tokens, log₂ scale)")
    ax.set_ylabel("mean loss (nats / token)")
    ax.grid(True, alpha=0.3)
    ax.set_title(
        title
        or f"Loss by position at L = {longest}, mean of {'/'.join(map(str, windows))} windows\n"
        f"({describe_protocol(results)}; trained at {describe_lengths(results)} tokens)"
    )
    _legend_outside(ax)
    return fig


def _windows(entry: dict[str, Any]) -> int:
    return int(entry["tokens"]) // int(entry.get("stride") or entry["length"])


def _legend_outside(ax: Any) -> None:
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)


def figure_format(path: Path | str) -> str:
    """The image format `path`'s suffix names (PNG without one); `ConfigError` for one matplotlib cannot write and
    `UserError` for a path that is a directory or cannot be written (`output_files.check_writable_dir`), so a
    bad --plot fails before any work."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    supported = FigureCanvasAgg(Figure()).get_supported_filetypes()
    if fmt not in supported:
        raise ConfigError(f"{path}: cannot write a .{fmt} figure (formats: {', '.join(sorted(supported))})")
    if path.is_dir():
        raise UserError(f"cannot write {path}: it is a directory")
    check_writable_dir(path.parent, shown=path)
    return fmt


def write_figure(fig: Figure, file: Path, fmt: str = "png", dpi: int = 120) -> None:
    """Draw `fig` into `file` as it is (no staging: `save_figure` or `output_files.staged_files` stage it)."""
    fig.savefig(file, format=fmt, dpi=dpi)


def save_figure(fig: Figure, path: Path | str, dpi: int = 120) -> Path:
    """Write a figure at `path` (format from its suffix, PNG by default) through `output_files.staged_files`: a
    kill leaves no temporary file behind that the next write would not remove; an unwritable place is one
    `UserError` naming it."""
    path = Path(path)
    fmt = figure_format(path)
    with staged_files(path.parent) as stage:
        write_figure(fig, stage(path.name), fmt, dpi)
    return path


def per_position_path(path: Path | str) -> Path:
    """`plots/ppl.png` -> `plots/ppl_per_position.png`."""
    path = Path(path)
    return path.with_name(f"{path.stem}_per_position{path.suffix or '.png'}")


def write_plots(results: Sequence[Result], path: Path | str) -> list[Path]:
    """Both eval-extrapolate figures: perplexity vs length at `path`, per-position loss next to it."""
    return [
        save_figure(ppl_vs_length_figure(results), path),
        save_figure(per_position_figure(results), per_position_path(path)),
    ]
