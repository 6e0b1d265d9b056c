"""The plain-log training line: each time is labelled, and the ETA is the time left at this process's pace."""

from __future__ import annotations

from posenc_cli.run.progress import eta_seconds, log_line


def step_event(step: int, elapsed: float) -> dict:
    return {"step": step, "steps": 100, "loss": 2.0, "lr": 1e-3, "interval_tokens_per_s": 5000.0, "elapsed_s": elapsed}


def test_eta_counts_only_this_process_pace() -> None:
    assert eta_seconds(10, 100, 5.0, None) is None  # nothing to go by yet
    assert eta_seconds(20, 100, 20.0, (10, 10.0)) == 80.0  # 1 s/step, 80 steps left
    assert eta_seconds(60, 100, 130.0, (50, 120.0)) == 40.0  # resumed at 50 after 120 s: the old time is not pace


def test_log_line_labels_elapsed_and_eta() -> None:
    # The README promised an ETA; the line showed elapsed time with no label.
    line = log_line(step_event(20, 20.0), (10, 10.0))
    assert line.endswith("| elapsed 0:00:20 | ETA 0:01:20")
    assert log_line(step_event(10, 5.0), None).endswith("| elapsed 0:00:05 | ETA -")
