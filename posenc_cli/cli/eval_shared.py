"""What the evaluation commands share (eval-extrapolate, eval-passkey, eval-tasks, eval-algorithmic): their list
flags parsed (`parse_list`), common options, the live progress display, and the summary they print at the end."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape

from posenc_cli import api
from posenc_cli.cli.app import console, err_console, path_exists, progress_bar
from posenc_cli.errors import ConfigError


def _integer(text: str) -> int:
    """'2048' or '1e12' -> an int; ValueError for anything that is not a whole number."""
    try:
        return int(text)
    except ValueError:
        value = float(text)
        if not value.is_integer():
            raise
        return int(value)


def parse_list(text: str, kind: type, flag: str) -> list[Any]:
    """'0.5,1,2' -> [0.5, 1.0, 2.0]; one clear error for anything else (integers may be written 1e6)."""
    convert = _integer if kind is int else kind
    try:
        values = [convert(x) for x in text.replace(" ", "").split(",") if x]
    except (ValueError, OverflowError):
        noun = "integers" if kind is int else "numbers"
        raise ConfigError(f"{flag} {text!r}: expected comma-separated {noun}, e.g. {flag} 1,2,4") from None
    if not values:
        raise ConfigError(f"{flag} needs at least one value")
    return values


def optional_list(text: str | None, kind: type, flag: str) -> list[Any] | None:
    return parse_list(text, kind, flag) if text is not None else None


def one_kind_of_lengths(lengths: str | None, abs_lengths: str | None) -> None:
    if lengths is not None and abs_lengths is not None:
        raise ConfigError("give either --lengths (multiples of the base length) or --abs-lengths (tokens), not both")


def build_eval_config(
    *,
    lengths: str | None,
    abs_lengths: str | None,
    protocol: str | None,
    stride: int | None,
    target: int | None = None,
    window: int | None = None,
    sinks: int | None = None,
    tokens: int | None,
    batch_tokens: int | None,
    dtype: str | None,
    force: bool,
    longppl: bool = True,
) -> Any:
    """The flags parsed into `api.eval_config` (EvalConfig defaults updated with those given, checked there)."""
    one_kind_of_lengths(lengths, abs_lengths)  # before either list is parsed
    return api.eval_config(
        lengths=optional_list(lengths, float, "--lengths"),
        abs_lengths=optional_list(abs_lengths, int, "--abs-lengths"),
        protocol=protocol,
        stride=stride,
        target=target,
        window=window,
        sinks=sinks,
        tokens=tokens,
        batch_tokens=batch_tokens,
        dtype=dtype,
        longppl=longppl,
        force=force,
    )


# ----------------------------------------------------------------------------------------------------------------
# Options, argument checks, progress display, summary and output files.


def option(help: str, *decls: str, **kwargs: Any) -> Any:
    """A typer option whose help text names its default (none shown by typer)."""
    return typer.Option(*decls, help=help, show_default=False, **kwargs)


def force_option(results_file: str) -> Any:
    return typer.Option("--force", help=f"Recompute cells already stored in {results_file}.")


RunDirsArgument = Annotated[
    list[str] | None,
    typer.Argument(
        help="Run or sweep directories (runs are found recursively).", metavar="RUN_DIR...", show_default=False
    ),
]
LengthsOption = Annotated[
    str | None, option("Prompt lengths as multiples of each run's base length (default 1,2,4,8).")
]
AbsLengthsOption = Annotated[str | None, option("Absolute prompt lengths in tokens instead, e.g. 128,512.")]
BatchTokensOption = Annotated[int, typer.Option(help="Prompt tokens per forward batch (memory bound).")]
DeviceOption = Annotated[str, typer.Option(help="auto, cpu, cuda or mps.")]
ThreadsOption = Annotated[int, typer.Option(help="CPU threads (0 = torch's default).")]
JsonOption = Annotated[
    Path | None, option("Write the combined results of all runs as JSON here.", "--json", dir_okay=False)
]


def check_run_args(paths: list[str], command: str, *, overrides: bool = False) -> None:
    """One clear error for a stray flag (or, for a command that takes none, a key=value override), or for no run
    directory at all. A sweep job's directory (`pos=rope,train.seed=0`) holds "=" too: only an argument that names
    no existing path is taken for an override."""
    problem = "unknown option" if overrides else "unexpected argument"
    stray = [p for p in paths if p.startswith("-") or (not overrides and "=" in p and not path_exists(p))]
    if stray:
        raise ConfigError(f"{problem} {stray[0]} (see posenc {command} --help)")
    if not paths:
        raise ConfigError("give at least one run directory (or a sweep directory holding runs)")


class Display:
    """Live progress on a terminal (stderr); plain lines on stderr otherwise (`run.progress.PlainProgress`: one per
    cell, and one at least every 10 s), so a log shows the evaluation is alive and piped stdout stays the table."""

    def __init__(self, unit: str) -> None:
        # deferred: keeps this command's modules off posenc --help start-up
        from posenc_cli.run.progress import PlainProgress

        self._progress = progress_bar()
        self._plain = None if err_console.is_terminal else PlainProgress(err_console)
        self._unit = unit
        self._task: Any = None
        self._run = ""

    def __enter__(self) -> Display:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def on_run(self, path: Path, index: int, total: int) -> None:
        self._run = f"[{index + 1}/{total}] {path.name}"
        if self._plain is not None:
            self._plain.note(f"{self._run}: {path}")

    def on_skip(self, path: Path, why: str) -> None:
        """A run found by a search that cannot be read: left out, said on one line (the table shows the others)."""
        err_console.print(f"[yellow]warning:[/] skipped {escape(str(path))}: {escape(why)}", highlight=False)

    def progress(self, what: str, done: int, total: int) -> None:
        description = f"{self._run} {what} ({self._unit})"
        if self._plain is not None:
            self._plain.update(description, done, total)
            return
        if self._task is None:
            self._task = self._progress.add_task(description, total=total)
        self._progress.update(self._task, description=description, completed=done, total=total)


Results = list[dict[str, Any]]


T = TypeVar("T")


def evaluate_timed(unit: str, evaluate: Callable[[Display], T]) -> tuple[T, float]:
    """`evaluate(display)` under a live progress display counting `unit`; (its results, seconds)."""
    start = time.perf_counter()
    with Display(unit) as display:
        results = evaluate(display)
    return results, time.perf_counter() - start


def report(
    results: Results,
    seconds: float,
    *,
    table: Any,
    results_file: str,
    plot: Path | None,
    write_plot: Callable[[Path], Iterable[Path]],
    json_path: Path | None,
    write_json: Callable[[Path], object],
    notes: Iterable[str] = (),
) -> None:
    """Print the table (and `notes` below it) and a one-line summary, then write the plot(s) and, with `json_path`,
    the combined JSON (`write_json`: the evaluation's own writer)."""
    console.print(table)
    for line in notes:
        console.print(line, highlight=False, markup=False)
    reused = sum(r["reused"] for r in results)
    cells = sum(len(r["entries"]) for r in results)
    note = f"; {reused} of {cells} cells reused from {results_file} (--force recomputes)" if reused else ""
    console.print(f"{len(results)} run(s) evaluated in {seconds:.1f} s{note}", highlight=False)
    for r in results:  # e.g. a run on read-only storage: scored, but its results file could not be written
        if r.get("not_saved"):
            err_console.print(f"[yellow]note:[/] not cached ({escape(r['not_saved'])})", highlight=False)
    if plot is not None:
        for path in write_plot(plot):
            console.print(f"wrote {path}", highlight=False)
    if json_path is not None:
        write_json(json_path)
        console.print(f"wrote {json_path}", highlight=False)
