"""Rendering of `train()` events: a rich progress bar on a terminal, plain log lines otherwise, a final summary;
and `PlainProgress`, the plain-line progress of the evaluations when their output is not a terminal.

Only the CLI uses this module; `train()` and the evaluations themselves never print.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from posenc_cli.run.outcome import TrainResult


class TrainDisplay:
    """Callable passed as `train(callback=...)`; use as a context manager so the live display is torn down."""

    def __init__(self, console: Console, *, live: bool, log_every: int) -> None:
        self.console = console
        self.live = live
        self.log_every = log_every
        self.progress: Progress | None = None
        self.data_task: TaskID | None = None
        self.train_task: TaskID | None = None
        self.stages: set[str] = set()
        self.ema: float | None = None
        self.first_step: tuple[int, float] | None = None  # (step, elapsed_s) of this process's first step

    def __enter__(self) -> TrainDisplay:
        if self.live:
            self.progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def print(self, text: str) -> None:
        (self.progress.console if self.progress is not None else self.console).print(text, highlight=False)

    def __call__(self, event: dict[str, Any]) -> None:
        handler = getattr(self, f"_on_{event['event']}", None)
        if handler is not None:
            handler(event)

    # -- events --------------------------------------------------------------------------------------------------
    def _on_data(self, e: dict[str, Any]) -> None:
        if self.progress is not None:
            if self.data_task is None:
                self.data_task = self.progress.add_task("data", total=None, info="")
            total = e["total"] if e["total"] and e["total"] > 0 else None
            self.progress.update(self.data_task, description=f"data: {e['stage']}", completed=e["done"], total=total)
        elif e["stage"] not in self.stages:
            self.print(f"data: {e['stage']} ...")
        self.stages.add(e["stage"])

    def _on_start(self, e: dict[str, Any]) -> None:
        if self.progress is not None and self.data_task is not None:
            self.progress.remove_task(self.data_task)
        how = f"resuming at step {e['step']}" if e["resumed"] else "new run"
        threads = f"{e['threads']} thread{'s' if e['threads'] != 1 else ''}"
        compiled = f" | {e['compile']}" if e.get("compile", "eager") != "eager" else ""
        self.print(
            f"[bold]train[/] {escape(str(e['run_dir']))} ({how}) | {e['n_params'] / 1e6:.2f}M parameters | "
            f"device {e['device']} | {e['precision']} | {threads} | {e['tokens_per_step']:,} tokens/step{compiled}"
        )
        if self.progress is not None:
            self.train_task = self.progress.add_task("train", total=e["steps"], completed=e["step"], info="")

    def _on_step(self, e: dict[str, Any]) -> None:
        loss = e["loss"]
        self.ema = loss if self.ema is None else 0.9 * self.ema + 0.1 * loss
        if self.progress is not None and self.train_task is not None:
            info = f"loss {self.ema:.4f} | lr {e['lr']:.2e} | {e['tokens_per_s']:,.0f} tok/s"
            self.progress.update(self.train_task, completed=e["step"], info=info)
        elif e["logged"]:
            self.print(log_line(e, self.first_step))
        if self.first_step is None:
            self.first_step = (e["step"], e["elapsed_s"])

    def _on_drope(self, e: dict[str, Any]) -> None:
        self.print(
            f"step {e['step']}: positions dropped (train.drope_at); training continues without them | "
            f"{e['n_params'] / 1e6:.2f}M parameters"
        )

    def _on_eval(self, e: dict[str, Any]) -> None:
        ppl = _ppl(e["val_loss"])
        self.print(f"step {e['step']}: val loss {e['val_loss']:.4f} (ppl {ppl})")


def notebook_display(log_every: int, *, always: bool = False) -> TrainDisplay | None:
    """The display `api.train` shows by itself: a live bar with the run's start line and validation losses on a
    fresh console, in a Jupyter notebook (rich draws its bar there) or anywhere when `always`; None otherwise (a
    script's `api.train` stays silent unless asked, `progress=True`)."""
    console = Console()
    if not (always or console.is_jupyter):
        return None
    return TrainDisplay(console, live=console.is_jupyter or console.is_terminal, log_every=log_every)


QUIET_S = 10.0  # an evaluation done within this many seconds prints no progress at all
EVERY_S = 10.0  # then a line at least this often, and one per completed cell


class PlainProgress:
    """Evaluation progress as plain lines, for a log or a pipe where a live bar cannot draw.

    Nothing is printed during the first `quiet_s` seconds (a quick evaluation stays its table); after that, `update`
    prints a line when a step completes (done == total: one cell, e.g. one length of one run) and otherwise at most
    one every `every_s` seconds, so a long cell still shows it is alive. `note` (a run starting) is printed at once
    after the quiet start, and during it is kept to open the first line printed.
    """

    def __init__(
        self,
        console: Console,
        *,
        every_s: float | None = None,
        quiet_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.every_s = EVERY_S if every_s is None else every_s
        self.quiet_s = QUIET_S if quiet_s is None else quiet_s
        self.clock = clock
        self.start = clock()
        self.last: float | None = None
        self.held: str | None = None

    def note(self, text: str) -> None:
        if self.clock() - self.start < self.quiet_s:
            self.held = text
        else:
            self._print(text)

    def update(self, description: str, done: int, total: int) -> None:
        now = self.clock()
        if now - self.start < self.quiet_s:
            return
        if done >= total or self.last is None or now - self.last >= self.every_s:
            if self.held is not None:
                self._print(self.held)
                self.held = None
            self._print(f"{description}: {done}/{total}")

    def _print(self, text: str) -> None:
        self.last = self.clock()
        self.console.print(f"{escape(text)} | elapsed {_duration(self.last - self.start)}", highlight=False)


def summary_table(result: TrainResult) -> Table:
    """Final summary: losses, perplexity, throughput, wall time, run directory."""
    table = Table(title="training summary", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    dropped = result.positions_dropped_at is not None
    rows = [
        ("run directory", str(result.run_dir)),
        ("steps", f"{result.step}/{result.steps} ({result.tokens:,} tokens)"),
        ("final train loss", _fmt(result.train_loss)),
        ("final val loss", f"{_fmt(result.val_loss)} nats/token (perplexity {_ppl(result.val_loss)})"),
        ("best val loss", _fmt(result.best_val_loss)),
        *([("positions", f"dropped after step {result.positions_dropped_at} (DroPE)")] if dropped else []),
        ("throughput", f"{result.tokens_per_s:,.0f} tokens/s ({result.device}, {result.precision})"),
        ("wall time", _duration(result.wall_time_s)),
    ]
    for k, v in rows:
        table.add_row(k, v)
    return table


def interrupted_message(result: TrainResult) -> str:
    name = signal.Signals(result.signal).name if result.signal is not None else "a signal"
    return (
        f"Interrupted by {name} at step {result.step}/{result.steps}; checkpoint saved in {result.run_dir}.\n"
        f"Resume with: posenc train --resume {result.run_dir}"
    )


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _ppl(loss: float | None) -> str:
    if loss is None or not math.isfinite(loss) or loss > 700:
        return "-"
    return f"{math.exp(loss):.2f}"


def log_line(e: dict[str, Any], first_step: tuple[int, float] | None) -> str:
    """A plain-log step line: step, loss, lr, tokens/s, time since the run began (resumes included) and the ETA
    (`eta_seconds`), each labelled."""
    eta = eta_seconds(e["step"], e["steps"], e["elapsed_s"], first_step)
    return (
        f"step {e['step']}/{e['steps']} | loss {e['loss']:.4f} | lr {e['lr']:.2e} | "
        f"{e['interval_tokens_per_s']:,.0f} tok/s | elapsed {_duration(e['elapsed_s'])} | "
        f"ETA {_duration(eta) if eta is not None else '-'}"
    )


def eta_seconds(step: int, steps: int, elapsed_s: float, first_step: tuple[int, float] | None) -> float | None:
    """Time left at this process's pace since its first step (a resumed run's earlier time does not count)."""
    if first_step is None or step <= first_step[0]:
        return None
    per_step = (elapsed_s - first_step[1]) / (step - first_step[0])
    return max(0.0, per_step * (steps - step))


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
