"""A sweep that stops itself at a chosen moment: the fault tests' child process.

`python sweep_fault.py PHASE:N:SIGNAL[:JOB] ARGS...` runs `posenc ARGS...` with `Fault` as every job's hooks (the
seam `posenc_cli.sweep.job.job_hooks`), so the job sends SIGNAL (TERM, INT, KILL) to its own process: PHASE `train`
after the N-th training (or fine-tuning) step, `evaluate` just before the evaluation starts (N = 0), `eval` at the
N-th progress report of the evaluation (mid-cell). JOB, when given, must occur in the job directory's path; other
jobs run untouched. Jobs run in this process (the basic launcher), as the fault tests' sweeps do.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from posenc_cli.sweep import job
from posenc_cli.sweep.job import Callback, JobHooks, Progress


class Fault(JobHooks):
    """Sends `signum` to this process when the job reaches (`phase`, `at`)."""

    def __init__(self, phase: str, at: int, signum: int) -> None:
        self.phase, self.at, self.signum = phase, at, signum
        self.count = 0

    @classmethod
    def parse(cls, spec: str, job_dir: Path) -> JobHooks:
        """`PHASE:N:SIGNAL[:JOB]` for the job in `job_dir`: a `Fault`, or no hooks when JOB names another job."""
        phase, at, name, *only = spec.split(":", 3)
        if only and only[0] not in Path(job_dir).as_posix():
            return JobHooks()
        return cls(phase, int(at), int(signal.Signals[f"SIG{name}"]))

    def hit(self, phase: str, n: int) -> None:
        if phase == self.phase and n == self.at:
            os.kill(os.getpid(), self.signum)

    def on_step(self, callback: Callback) -> Callback:
        def wrapped(event: dict) -> None:
            callback(event)
            if event.get("event") == "step":
                self.hit("train", int(event["step"]))

        return wrapped

    def before_evaluate(self) -> None:
        self.hit("evaluate", 0)

    def on_progress(self, progress: Progress) -> Progress:
        def wrapped(what: str, done: int, total: int) -> None:
            progress(what, done, total)
            self.count += 1
            self.hit("eval", self.count)

        return wrapped


def main() -> None:
    spec, *args = sys.argv[1:]
    job.job_hooks = lambda job_dir: Fault.parse(spec, job_dir)
    sys.argv = ["posenc", *args]
    from posenc_cli.cli import main as posenc

    posenc()


if __name__ == "__main__":
    main()
