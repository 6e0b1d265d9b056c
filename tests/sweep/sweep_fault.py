"""A sweep that stops itself at a chosen moment: the fault tests' child process.

`python sweep_fault.py PHASE:N:SIGNAL[:JOB] ARGS...` runs `posenc ARGS...` with every job's training, evaluation and
progress reports wrapped (`Fault.install` replaces the names `posenc_cli.sweep.job` calls: `train`, `execute`,
`evaluate_each_run`, `EvalRecorder`), so the job sends SIGNAL (TERM, INT, KILL) to its own process: PHASE `train`
after the N-th training (or fine-tuning) step, `evaluate` just before the evaluation starts (N = 0), `eval` at the
N-th progress report of the evaluation (mid-cell). JOB, when given, must occur in the job directory's path; other
jobs run untouched. Jobs run in this process (the basic launcher), as the fault tests' sweeps do.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posenc_cli.sweep import job


class Fault:
    """Sends `signum` to this process when a job whose directory holds `only` reaches (`phase`, `at`)."""

    def __init__(self, spec: str) -> None:
        phase, at, name, *only = spec.split(":", 3)
        self.phase, self.at, self.signum = phase, int(at), int(signal.Signals[f"SIG{name}"])
        self.only = only[0] if only else None
        self.count = 0

    def applies(self, job_dir: Path | str) -> bool:
        return self.only is None or self.only in Path(job_dir).as_posix()

    def hit(self, phase: str, n: int) -> None:
        if phase == self.phase and n == self.at:
            os.kill(os.getpid(), self.signum)

    def on_step(self, callback: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
        def wrapped(event: dict[str, Any]) -> None:
            callback(event)
            if event.get("event") == "step":
                self.hit("train", int(event["step"]))

        return wrapped

    def install(self) -> None:
        """Wrap what `posenc_cli.sweep.job` calls, for the jobs this fault applies to."""
        train, execute, evaluate_each_run = job.train, job.execute, job.evaluate_each_run
        fault = self

        def faulty_train(cfg: Any, run_dir: Path, **kwargs: Any) -> Any:
            if self.applies(run_dir):
                kwargs["callback"] = self.on_step(kwargs["callback"])
            return train(cfg, run_dir, **kwargs)

        def faulty_execute(plan: Any, **kwargs: Any) -> Any:
            if self.applies(plan.out):
                kwargs["callback"] = self.on_step(kwargs["callback"])
            return execute(plan, **kwargs)

        def faulty_evaluate(run_dirs: list[Path], *args: Any, **kwargs: Any) -> Any:
            if any(self.applies(d) for d in run_dirs):
                self.count = 0  # progress reports are counted per job
                self.hit("evaluate", 0)
            return evaluate_each_run(run_dirs, *args, **kwargs)

        class FaultyRecorder(job.EvalRecorder):  # type: ignore[misc,valid-type]
            def __call__(self, description: str, done: int, total: int) -> None:
                super().__call__(description, done, total)
                if fault.applies(self.run.path):
                    fault.count += 1
                    fault.hit("eval", fault.count)

        job.train, job.execute, job.evaluate_each_run = faulty_train, faulty_execute, faulty_evaluate
        job.EvalRecorder = FaultyRecorder


def main() -> None:
    spec, *args = sys.argv[1:]
    Fault(spec).install()
    sys.argv = ["posenc", *args]
    from posenc_cli.cli import main as posenc

    posenc()


if __name__ == "__main__":
    main()
