"""algorithmic_plot: accuracy against instance length, a panel per task, a line per run, gate-flagged runs dashed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posenc_cli.report import algorithmic_plot as ap
from posenc_cli.report.gate import LEARNED, NOT_LEARNED


def cell(task: str, length: int, accuracy: float | None, token: float | None = None, low: int = 2) -> dict[str, Any]:
    return {
        "task": task,
        "length": length,
        "train_min_length": low,
        "train_max_length": 4,
        "status": "ok" if accuracy is not None else "n/a",
        "accuracy": accuracy,
        "token_accuracy": token,
    }


@dataclass(frozen=True)
class Gate:
    status: str
    lengths: tuple[int, int] | None = (2, 4)


ROPE = {
    "run": "rope-0",
    "scheme": "rope",
    "entries": [cell("mqar", n, a, t) for n, a, t in [(2, 1.0, 1.0), (4, 0.5, 0.9), (8, 0.0, 0.4), (6, 0.1, 0.6)]]
    + [cell("s5", n, a) for n, a in [(2, 1.0), (3, 0.9), (5, 0.2)]],
}
NOPE = {
    "run": "nope-0",
    "scheme": "nope",
    "entries": [cell("mqar", 2, 0.0, 0.3), cell("mqar", 4, 0.0, 0.2), cell("mqar", 8, None)],  # 8: n/a
}


def test_series_takes_the_metric_asked_in_length_order_and_skips_na() -> None:
    assert ap.task_series(ROPE, "mqar", "token_accuracy") == ([2, 4, 6, 8], [1.0, 0.9, 0.6, 0.4])
    assert ap.task_series(ROPE, "mqar") == ([2, 4, 6, 8], [1.0, 0.5, 0.1, 0.0])
    assert ap.task_series(NOPE, "mqar", "token_accuracy") == ([2, 4], [0.3, 0.2])
    assert ap.task_series(NOPE, "s5") == ([], [])


def lines(ax: Any) -> dict[str, Any]:
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_one_panel_per_task_each_in_its_metric_flagged_runs_dashed() -> None:
    gates = [{"mqar": Gate(LEARNED), "s5": Gate(NOT_LEARNED)}, {"mqar": Gate(NOT_LEARNED)}]
    fig = ap.accuracy_by_length_figure([ROPE, NOPE], gates, {"mqar": "token_accuracy"})
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["mqar", "s5"]
    mqar, s5 = panels
    assert mqar.get_ylabel() == "per-token accuracy" and s5.get_ylabel() == "exact match"
    shown = lines(mqar)
    rope, nope = shown["rope-0"], shown["nope-0 — ✗ not learned"]
    assert list(rope.get_ydata()) == [1.0, 0.9, 0.6, 0.4] and rope.get_linestyle() == "-"
    assert list(nope.get_xdata()) == [2, 4] and nope.get_linestyle() == "--"
    assert "training lengths" in shown
    assert list(lines(s5)) == ["rope-0 — ✗ not learned", "training lengths"]  # nope has no s5 cells
    shaded = [p for p in mqar.patches]  # the training lengths 2..4, shaded once
    assert len(shaded) == 1
    x0, x1 = shaded[0].get_x(), shaded[0].get_x() + shaded[0].get_width()
    assert (x0, x1) == (1.5, 4.5)


def test_without_gates_every_line_is_solid_and_spans_come_from_the_cells() -> None:
    fig = ap.accuracy_by_length_figure([ROPE])
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert all(line.get_linestyle() == "-" for ax in panels for line in ax.get_lines() if line.get_xdata().size)
    assert len(panels[0].patches) == 1


def test_no_results_draws_an_empty_figure() -> None:
    fig = ap.accuracy_by_length_figure([])
    assert not any(ax.get_lines() for ax in fig.axes)
