"""Rendering of a sweep's profile (`posenc sweep --profile`): where the time went and how close to the peak."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from posenc_cli.api.profiles import profile_rows


def _sig(value: float | None) -> str:
    """Three significant digits below 1000 (micro models do fractions of a GFLOP), thousands separators above."""
    if value is None:
        return ""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def print_profile(doc: dict[str, Any], console: Console) -> None:
    """Per phase: seconds summed over jobs, share, GFLOP, GFLOP/s, % of the same dtype's matmul peak; then the
    sweep's stages and its own phases, and one line for the whole sweep."""
    table = Table(title="where the time went (jobs' phases, summed over jobs)", title_justify="left")
    for name in ("phase", "s", "share", "GFLOP", "GFLOP/s", "% of peak"):
        table.add_column(name, justify="left" if name == "phase" else "right")
    for row in profile_rows(doc):
        eff = row["efficiency"]
        table.add_row(
            row["phase"],
            f"{row['seconds']:.1f}",
            f"{100 * row['share']:.0f}%",
            _sig(row["gflop"]),
            _sig(row["gflops_per_s"]),
            _sig(None if eff is None else 100 * eff),
        )
    console.print(table)
    stages = ", ".join(f"{s['stage']} {s['wall_s']:.1f} s" for s in doc.get("stages") or [])
    own = ", ".join(f"{k} {v:.1f} s" for k, v in (doc.get("parent") or {}).items())
    console.print(f"stages (wall): {stages or 'none run'}; sweep process: {own}", highlight=False)
    total = doc.get("total") or {}
    peaks = ", ".join(f"{k} {v:.0f}" for k, v in (doc.get("peak_gflops") or {}).items())
    line = f"whole sweep: {total.get('wall_s', 0):.1f} s, {_sig(total.get('gflops_per_s'))} GFLOP/s"
    if total.get("efficiency") is not None:
        line += f" = {_sig(100 * total['efficiency'])}% of the {total['machine_peak_key']} matmul peak"
    if peaks:
        line += f" (peaks, GFLOP/s: {peaks})"
    if doc.get("missing"):
        line += f"; no profile for {len(doc['missing'])} job(s)"
    console.print(line, highlight=False)
