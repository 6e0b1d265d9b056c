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


def test_plain_progress_prints_each_completed_cell_and_at_most_every_interval() -> None:
    """Evaluations piped to a log printed nothing for 80 s: plain lines now, one per cell and one per interval,
    after a quiet start (an evaluation done within it prints only its table)."""
    import io

    from rich.console import Console

    from posenc_cli.run.progress import PlainProgress

    now = [0.0]
    out = io.StringIO()
    progress = PlainProgress(Console(file=out, width=200), every_s=10.0, quiet_s=3.0, clock=lambda: now[0])
    progress.note("[1/2] rope")
    for done in range(1, 6):  # one window a second: after the quiet 3 s, one line, then nothing for 10 s
        now[0] += 1.0
        progress.update("[1/2] rope L=64 (windows)", done, 20)
    now[0] += 9.0  # 11 s since the last line
    progress.update("[1/2] rope L=64 (windows)", 6, 20)
    now[0] += 1.0
    progress.update("[1/2] rope L=64 (windows)", 20, 20)  # the cell is complete: printed at once
    progress.note("[2/2] alibi")
    lines = out.getvalue().splitlines()
    assert lines == [
        "[1/2] rope | elapsed 0:00:03",  # the note held during the quiet start opens the first line
        "[1/2] rope L=64 (windows): 3/20 | elapsed 0:00:03",
        "[1/2] rope L=64 (windows): 6/20 | elapsed 0:00:14",
        "[1/2] rope L=64 (windows): 20/20 | elapsed 0:00:15",
        "[2/2] alibi | elapsed 0:00:15",
    ]
    quiet = io.StringIO()
    progress = PlainProgress(Console(file=quiet, width=200), quiet_s=10.0, clock=lambda: 5.0)
    progress.note("[1/1] rope")
    progress.update("[1/1] rope L=64 (windows)", 20, 20)
    assert quiet.getvalue() == ""  # done within the quiet start: nothing but the table
