"""The over-seeds task tables' words (`report.task_seed_report`): mean ± sd in %, no ± for one seed, n/a with the
count of seeds that scored, the gate's count, and a table per task × scoring in rich and markdown alike."""

from __future__ import annotations

import math

from rich.console import Console

from posenc_cli.report.gate import LEARNED, NOT_LEARNED, NOT_MEASURED, NOT_TRAINED
from posenc_cli.report.task_seed_report import seed_gate_text, seed_markdown, seed_score_text, seed_tables


def row(label: str, length: int, mean: float | None, sd: float | None, *, n: int = 3, measured: int | None = None,
        n_learned: int = 3, competence: str = LEARNED, task: str = "niah-single") -> dict:  # fmt: skip
    return {"label": label, "task": task, "scoring": "contains", "length": length, "multiple": length / 16,
            "mean": mean, "sd": sd, "n": n, "measured": n if measured is None else measured, "n_learned": n_learned,
            "competence": competence, "in_distribution": 0.95 if competence != NOT_MEASURED else None}  # fmt: skip


def test_a_cell_is_mean_and_sd_in_percent_and_one_seed_has_no_spread() -> None:
    assert seed_score_text(row("rope", 16, 0.95, 0.05)) == "95 ± 5"
    assert seed_score_text(row("t5", 16, 0.7, None, n=1)) == "70"
    assert seed_score_text(row("t5", 16, 0.7, math.nan, n=1)) == "70"  # a DataFrame's NaN reads as no number
    assert seed_score_text(row("rope", 64, None, None, measured=2)) == "n/a (2/3)"
    assert seed_score_text(row("rope", 64, math.nan, math.nan, measured=0)) == "n/a"


def test_the_gate_counts_the_seeds_that_learned() -> None:
    assert seed_gate_text(LEARNED, 3, 3) == "3/3 learned"
    assert seed_gate_text(NOT_LEARNED, 1, 3) == "✗ 1/3 learned"
    assert seed_gate_text(NOT_TRAINED, 0, 2) == "⊘ not trained on this task"
    assert seed_gate_text(NOT_MEASURED, 1, 2) == "– (not measured) · 1/2 learned"


ROWS = [
    row("rope", 16, 0.95, 0.05),
    row("rope", 32, 0.5, 0.1),
    row("rope", 64, None, None, measured=2),
    row("t5", 16, 0.9, None, n=1, n_learned=1),
    row("alibi", 16, 0.3, 0.14, n=2, n_learned=0, competence=NOT_TRAINED, task="niah-multikey"),
]


def test_rich_and_markdown_show_one_row_per_experiment() -> None:
    console = Console(width=250, record=True)
    tables = seed_tables(ROWS)
    assert [t.title for t in tables] == [
        "niah-single · RULER score over seeds (%, mean ± sd)",
        "niah-multikey · RULER score over seeds (%, mean ± sd)",
    ]
    for table in tables:
        console.print(table)
    lines = [" ".join(x.replace("│", " ").split()) for x in console.export_text().splitlines()]
    assert "rope 3 95 ± 5 50 ± 10 n/a (2/3) 95 3/3 learned" in lines
    assert "t5 1 90 – – 95 1/1 learned" in lines  # no ±, and lengths it never stored
    assert "alibi 2 30 ± 14 95 ⊘ not trained on this task" in lines
    text = seed_markdown(ROWS, competence=0.8)
    assert "| run | n | 1× | 2× | 4× | ≤L | gate |" in text
    assert "| rope | 3 | 95 ± 5 | 50 ± 10 | n/a (2/3) | 95 | 3/3 learned |" in text
    assert "| t5 | 1 | 90 | – | – | 95 | 1/1 learned |" in text
    assert "≥ 80%" in text and "effective length is per run" in text
    assert seed_markdown([]) == ""
