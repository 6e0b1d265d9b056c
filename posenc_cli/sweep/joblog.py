"""A sweep job's log: its lines led by the job's label, and whether a signal reached its training.

Jobs of a parallel launcher (joblib, submitit) write to one terminal or log file; `job_console` gives a job's
progress display a console whose every line starts with `log_label` (`[pos=alibi seed=1]`). `SignalSeen` reads the
training loop's signal handler (`run.interrupts.Interrupts`) while the steps run, so a signal at the last step,
after which training completes and reports none, still stops the sweep.
"""

from __future__ import annotations

import io
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from posenc_cli.run.interrupts import Interrupts
from posenc_cli.sweep.hydra_bridge import JobInfo


def log_label(info: JobInfo, action: str, sweep_dir: Path | None) -> str:
    """'[pos=alibi seed=1]': the job's own overrides by their last key part, so the lines of parallel jobs can be
    told apart; an extend job's also names its stage and parent ('[extend pos=rope finetune_steps=60]')."""
    own = [f"{o.split('=', 1)[0].lstrip('+~').rsplit('.', 1)[-1]}={o.split('=', 1)[1]}" for o in info.overrides]
    where = info.output_dir
    if sweep_dir is not None and where.is_relative_to(sweep_dir):
        where = where.relative_to(sweep_dir)
    context = list(where.parts[:-1]) if action != "train" else []
    return f"[{' '.join([*context, *own]) or where.as_posix()}]"


class Prefixed(io.TextIOBase):
    """A text stream that starts every line with `prefix` (a job's log lines, among other jobs')."""

    def __init__(self, stream: Any, prefix: str) -> None:
        self.stream, self.prefix, self.line_start = stream, prefix, True

    def write(self, text: str) -> int:
        pieces = []
        for piece in text.splitlines(keepends=True):
            pieces.append(self.prefix + piece if self.line_start else piece)
            self.line_start = piece.endswith("\n")
        self.stream.write("".join(pieces))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


def job_console(label: str) -> Console:
    """Plain log lines, each led by the job's label (jobs may run in parallel worker processes or on cluster nodes,
    where logs are files)."""
    return Console(file=Prefixed(sys.stdout, f"{label} "), soft_wrap=True)


class SignalSeen:
    """Whether a signal reached training's handler (`run.interrupts.Interrupts`), also one at the last step, after
    which training completes and reports no signal: the handler is read while the steps run."""

    def __init__(self) -> None:
        self.handler: Interrupts | None = None

    def wrap(self, callback: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
        def wrapped(event: dict[str, Any]) -> None:
            if event.get("event") == "step" and self.handler is None:
                handler = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
                self.handler = handler if isinstance(handler, Interrupts) else None
            callback(event)

        return wrapped

    @property
    def signum(self) -> int | None:
        return None if self.handler is None else (self.handler.signum or self.handler.pending)
