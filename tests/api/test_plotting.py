"""api.plot_accuracy_by_length: an eval-algorithmic result drawn per task in its reference's measure and written;
`reference_metrics` reads that measure off the task registry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from posenc_cli.api.evaluation import TaskEvaluation
from posenc_cli.api.plotting import plot_accuracy_by_length, reference_metrics
from posenc_cli.errors import ConfigError
from posenc_cli.report import algorithmic_plot


def cell(task: str, length: int) -> dict[str, Any]:
    return {
        "task": task,
        "length": length,
        "train_min_length": 1,
        "train_max_length": 2,
        "status": "ok",
        "accuracy": 0.25,
        "token_accuracy": 0.75,
    }


EVALUATION = TaskEvaluation(
    results=[{"run": "r", "scheme": "rope", "entries": [cell("mqar", 1), cell("mqar", 3), cell("s5", 2)]}],
    gates=[{}],
    tasks=["mqar", "s5"],
    competence=0.8,
)


def test_reference_metrics_per_task_from_the_registry() -> None:
    assert reference_metrics(["mqar", "flipflop", "flipflop_sparse", "s5", "copy", "no-such-task"]) == {
        "mqar": "token_accuracy",
        "flipflop": "token_accuracy",
        "flipflop_sparse": "token_accuracy",
        "s5": "accuracy",
        "copy": "accuracy",
    }


def test_plot_writes_the_figure_with_each_tasks_measure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    draw = algorithmic_plot.accuracy_by_length_figure

    def spy(results: Any, gates: Any, metrics: Any, competence: float, title: str | None = None) -> Any:
        seen.update(metrics=metrics, competence=competence)
        return draw(results, gates, metrics, competence, title)

    monkeypatch.setattr(algorithmic_plot, "accuracy_by_length_figure", spy)
    path = plot_accuracy_by_length(EVALUATION, tmp_path / "acc.png")
    assert path == tmp_path / "acc.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert seen == {"metrics": {"mqar": "token_accuracy", "s5": "accuracy"}, "competence": 0.8}


def test_plot_refuses_a_format_matplotlib_cannot_write(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot write a .xyz figure"):
        plot_accuracy_by_length(EVALUATION, tmp_path / "acc.xyz")
    assert not (tmp_path / "acc.xyz").exists()
