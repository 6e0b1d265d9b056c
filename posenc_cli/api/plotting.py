"""Figures of evaluation results as functions: `plot_accuracy_by_length`, eval-algorithmic's accuracy against
instance length per scheme, one panel per task (`eval-algorithmic --plot`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from posenc_cli.api.evaluation import TaskEvaluation

__all__ = ["plot_accuracy_by_length", "reference_metrics"]


def reference_metrics(tasks: Iterable[str]) -> dict[str, str]:
    """Task -> the cell measure its reference reports (`AlgorithmicTask.reference_metric`: "token_accuracy" for
    MQAR's per-query and flip-flop's per-read accuracy, "accuracy", exact match, for the others); names the registry
    does not hold are left out."""
    # deferred: the task generators
    from posenc_cli.data.algorithmic import registry

    known = registry()
    return {t: known[t].reference_metric for t in tasks if t in known}


def plot_accuracy_by_length(evaluation: TaskEvaluation, path: str | Path, *, title: str | None = None) -> Path:
    """Write the accuracy-against-length figure of an `evaluate_algorithmic` result at `path` (format from its
    suffix, PNG by default): one panel per task, one line per run, each task in its reference's measure
    (`reference_metrics`), training lengths shaded, runs the competence gate flags dashed. Returns the path."""
    # deferred: matplotlib
    from posenc_cli.report.algorithmic_plot import accuracy_by_length_figure
    from posenc_cli.report.plots import figure_format, save_figure

    figure_format(path)  # a bad suffix or an unwritable place fails before drawing
    tasks = {str(e["task"]) for r in evaluation.results for e in r["entries"]}
    figure = accuracy_by_length_figure(
        evaluation.results, evaluation.gates, reference_metrics(tasks), evaluation.competence, title
    )
    return save_figure(figure, path)
