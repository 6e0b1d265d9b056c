"""passkey_report: the accuracy grid behind the table and heatmap, and both renderings."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from posenc_cli.report import passkey_report as pr


def entry(length: int, depth: float, accuracy: float | None, reason: str | None = None) -> dict[str, Any]:
    ok = accuracy is not None
    return {
        "length": length,
        "multiple": length / 128,
        "depth": depth,
        "trials": 4,
        "status": "ok" if ok else "n/a",
        "reason": reason,
        "accuracy": accuracy,
        "token_accuracy": None if accuracy is None else min(1.0, accuracy + 0.25),
    }


def result(run: str, scheme: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"run": run, "scheme": scheme, "train_length": 128, "base_length": 128, "entries": entries}


ROPE = result(
    "r0",
    "rope",
    [entry(256, 1.0, 0.5), entry(128, 0.0, 1.0), entry(128, 1.0, 0.75), entry(256, 0.0, 0.0)],
)
LEARNED = result(
    "r1",
    "learned",
    [entry(128, 0.0, 0.25), entry(128, 1.0, 0.5), *(entry(256, d, None, "beyond 128 positions") for d in (0.0, 1.0))],
)


def test_accuracy_grid_sorts_rows_and_columns_and_collects_reasons() -> None:
    rows, cols, grid, reasons = pr.accuracy_grid(ROPE)
    assert rows == [(128, 1.0), (256, 2.0)] and cols == [0.0, 1.0]
    np.testing.assert_array_equal(grid, [[1.0, 0.75], [0.0, 0.5]])
    assert reasons == {}
    _, _, grid, reasons = pr.accuracy_grid(LEARNED)
    assert np.isnan(grid[1]).all() and not np.isnan(grid[0]).any()
    assert reasons == {"beyond 128 positions": "256"}
    np.testing.assert_array_equal(pr.accuracy_grid(ROPE, "token_accuracy")[2], [[1.0, 1.0], [0.25, 0.75]])


def test_table_shows_cells_means_and_why_cells_are_missing() -> None:
    console = Console(record=True, width=200)
    console.print(pr.passkey_table([ROPE, LEARNED]))
    text = console.export_text()
    assert "trained at 128 tokens" in text and "length \\ depth" in text
    rope_1x = next(line for line in text.splitlines() if "r0 (rope)" in line)
    assert re.findall(r"\d+%", rope_1x) == ["100%", "75%", "88%", "100%"]  # depths 0, 1; mean; digits (clamped)
    learned_2x = [line for line in text.splitlines() if "2× · 256" in line][-1]  # the second section
    assert learned_2x.count("n/a") == 4  # both depths, the mean and the digits
    assert "n/a for r1 (learned) at 256: beyond 128 positions" in text
    assert "over 4 trials per cell" in text


def test_figure_has_one_heatmap_per_run(tmp_path: Path) -> None:
    from posenc_cli.report.plots import save_figure

    fig = pr.passkey_figure([ROPE, LEARNED, ROPE, LEARNED])
    heatmaps = [ax for ax in fig.axes if ax.images]
    assert len(heatmaps) == 4 and [ax.get_title() for ax in heatmaps][:2] == ["r0 (rope)", "r1 (learned)"]
    masked = heatmaps[1].images[0].get_array()
    assert masked.mask[1].all() and not masked.mask[0].any()  # n/a cells are masked (drawn grey)
    hidden = [ax for ax in fig.axes if not ax.images and not ax.axison]
    assert len(hidden) == 2  # 4 runs on a 2 × 3 grid: two empty panels switched off
    assert save_figure(fig, tmp_path / "pk.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not math.isnan(float(masked[0, 0]))


def test_the_competence_gate_marks_runs_in_the_table_and_the_figure() -> None:
    from posenc_cli.analysis.task_results import passkey_gates

    gates = passkey_gates([ROPE, LEARNED], 0.8)  # accuracy at lengths <= 128: r0 88% (learned), r1 38%
    assert gates == [("learned", 0.875), ("not learned", 0.375)]
    console = Console(record=True, width=200)
    console.print(pr.passkey_table([ROPE, LEARNED], gates, 0.8))
    text = console.export_text()
    assert "≤L" in text and "below 80%" in " ".join(text.split())
    rope_1x = next(line for line in text.splitlines() if "r0 (rope)" in line)
    learned_1x = next(line for line in text.splitlines() if "r1 (learned)" in line)
    assert rope_1x.rstrip(" │").endswith("88%") and "38% ✗ not learned" in learned_1x
    untrained = [("not trained on this task", 0.875), ("not learned", 0.375)]
    fig = pr.passkey_figure([ROPE, LEARNED], untrained, 0.8)
    titles = [ax.get_title() for ax in fig.axes if ax.images]
    assert titles == ["r0 (rope)\n⊘ not trained on this task", "r1 (learned)\n✗ not learned"]
    assert [p.get_hatch() for ax in fig.axes for p in ax.patches] == ["xx", "//"]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["✗ not learned (≤L below 80%)", "⊘ not trained on this task"]
    assert not pr.passkey_figure([ROPE]).legends  # without gates: as before
