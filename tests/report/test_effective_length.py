"""RULER's effective length (NVIDIA/RULER README.md:54): the longest length up to which the score stays at or above
the threshold; "none" when the shortest fails, "≥ N" when the longest measured still passes, n/a lengths skipped."""

from __future__ import annotations

import pytest

from posenc_cli.report.effective_length import RULER_THRESHOLD, effective_length
from posenc_cli.report.retrieval_report import length_scores


def test_default_threshold_is_llama2_7b_at_4k() -> None:
    assert RULER_THRESHOLD == 0.856


@pytest.mark.parametrize(
    ("scores", "label"),
    [
        ([(128, 0.95), (256, 0.9), (512, 0.5), (1024, 0.2)], "256"),
        ([(128, 0.95), (256, 0.5), (512, 0.99)], "128"),  # "stays": a later pass does not extend it
        ([(512, 0.2), (128, 0.99), (256, 0.99)], "256"),  # order of the pairs does not matter
        ([(128, 0.5), (256, 0.9)], "none"),
        ([(128, 0.9), (256, 0.86)], "≥ 256"),  # the longest measured still passes: a lower bound
        ([(128, 0.856), (256, 0.8559)], "128"),  # at the threshold passes
        ([(128, None), (256, 0.9), (512, None)], "≥ 256"),  # n/a lengths neither pass nor fail
        ([(128, None), (256, 0.1), (512, 0.95)], "none"),
        ([(128, None)], "n/a"),
        ([], "n/a"),
    ],
)
def test_effective_length(scores, label: str) -> None:
    assert effective_length(scores).label == label


def test_threshold_is_a_parameter() -> None:
    scores = [(128, 0.6), (256, 0.4), (512, 0.1)]
    assert effective_length(scores, 0.5).label == "128"
    assert effective_length(scores, 0.3).label == "256"
    assert effective_length(scores, 0.0).label == "≥ 512"
    e = effective_length(scores, 0.3)
    assert (e.length, e.open_ended, e.measured, e.threshold) == (256, False, 3, 0.3)


def test_length_scores_average_depths_and_need_every_depth() -> None:
    def cell(length: int, depth, score) -> dict:
        ok = score is not None
        return {"length": length, "depth": depth, "status": "ok" if ok else "n/a", "score": score}

    cells = [cell(128, 0.0, 1.0), cell(128, 1.0, 0.5), cell(256, 0.0, 0.9), cell(256, 1.0, None), cell(512, None, 0.2)]
    assert length_scores(cells) == [(128, 0.75), (256, None), (512, 0.2)]
