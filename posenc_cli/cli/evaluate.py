"""`posenc eval-extrapolate` (perplexity at and beyond the training length) and `posenc eval-passkey` (retrieval)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape

from posenc_cli.cli.app import app, console, err_console, handles_errors, progress_bar, split_args
from posenc_cli.errors import ConfigError

_EXAMPLES = """
[bold]Examples[/]

  posenc eval-extrapolate outputs/runs/rope-tiny outputs/runs/alibi-tiny --plot ppl.png
  posenc eval-extrapolate outputs/sweeps/schemes --lengths 1,2,4,8 --tokens 8192
  posenc eval-extrapolate RUN --protocol sliding --stride 64 --abs-lengths 256,1024
  posenc eval-extrapolate RUN --protocol fixed-target --target 128 --lengths 1,2,4,8   [dim](same tokens scored)[/]
  posenc eval-extrapolate RUN --protocol streaming --window 124 --sinks 4   [dim](StreamingLLM)[/]
  posenc eval-extrapolate RUN data=text data.paths=\\[held_out.txt]   [dim](a held-out file, scored whole)[/]
  posenc eval-extrapolate RUN --positions sequential   [dim](a train.random_positions run fed 0..T-1)[/]
"""


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


def _optional_list(text: str | None, kind: type, flag: str) -> list[Any] | None:
    return parse_list(text, kind, flag) if text is not None else None


def set_grid(
    cfg: Any,
    lengths: str | None,
    abs_lengths: str | None,
    depths: str | None,
    paths: list[str] | None = None,
) -> None:
    """Set a retrieval evaluation's `lengths`, `abs_lengths` and `depths` from their comma-separated flags (the ones
    given; the config's defaults stay for the others). With the command's run `paths`, then refuse a grid no memory
    can hold for them (`evaluation.grid.check_grid_fits`: multiples of each run's base length are known only there;
    eval-tasks checks its episodes itself and passes none)."""
    for field, text, kind, flag in (
        ("lengths", lengths, float, "--lengths"),
        ("abs_lengths", abs_lengths, int, "--abs-lengths"),
        ("depths", depths, float, "--depths"),
    ):
        if text is not None:
            setattr(cfg, field, parse_list(text, kind, flag))
    if paths is not None:
        # deferred: keeps this command's modules off posenc --help start-up
        from posenc_cli.evaluation.grid import check_grid_fits

        check_grid_fits(cfg, paths)


def _one_kind_of_lengths(lengths: str | None, abs_lengths: str | None) -> None:
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
) -> Any:
    """The flags parsed into `api.eval_config` (EvalConfig defaults updated with those given, checked there)."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.analysis import api

    _one_kind_of_lengths(lengths, abs_lengths)  # before either list is parsed
    return api.eval_config(
        lengths=_optional_list(lengths, float, "--lengths"),
        abs_lengths=_optional_list(abs_lengths, int, "--abs-lengths"),
        protocol=protocol,
        stride=stride,
        target=target,
        window=window,
        sinks=sinks,
        tokens=tokens,
        batch_tokens=batch_tokens,
        dtype=dtype,
        force=force,
    )


# ----------------------------------------------------------------------------------------------------------------
# Shared by both commands: options, argument checks, progress display, summary and output files.


def _option(help: str, *decls: str, **kwargs: Any) -> Any:
    """A typer option whose help text names its default (none shown by typer)."""
    return typer.Option(*decls, help=help, show_default=False, **kwargs)


def _force_option(results_file: str) -> Any:
    return typer.Option("--force", help=f"Recompute cells already stored in {results_file}.")


DeviceOption = Annotated[str, typer.Option(help="auto, cpu, cuda or mps.")]
ThreadsOption = Annotated[int, typer.Option(help="CPU threads (0 = torch's default).")]
JsonOption = Annotated[
    Path | None, _option("Write the combined results of all runs as JSON here.", "--json", dir_okay=False)
]


def _check_run_args(paths: list[str], stray: list[str], problem: str, command: str) -> None:
    """One clear error for a stray flag or override, or for no run directory at all."""
    if stray:
        raise ConfigError(f"{problem} {stray[0]} (see posenc {command} --help)")
    if not paths:
        raise ConfigError("give at least one run directory (or a sweep directory holding runs)")


class _Display:
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

    def __enter__(self) -> _Display:
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


def _evaluate_timed(unit: str, evaluate: Callable[[_Display], T]) -> tuple[T, float]:
    """`evaluate(display)` under a live progress display counting `unit`; (its results, seconds)."""
    start = time.perf_counter()
    with _Display(unit) as display:
        results = evaluate(display)
    return results, time.perf_counter() - start


def _report(
    results: Results,
    seconds: float,
    *,
    table: Any,
    results_file: str,
    plot: Path | None,
    write_plot: Callable[[Path], Iterable[Path]],
    json_path: Path | None,
    combined: dict[str, Any],
    notes: Iterable[str] = (),
) -> None:
    """Print the table (and `notes` below it) and a one-line summary, then write the plot(s) and the combined JSON
    if asked."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.fsutil import atomic_write_json

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
        atomic_write_json(json_path, combined)
        console.print(f"wrote {json_path}", highlight=False)


# ----------------------------------------------------------------------------------------------------------------
# eval-extrapolate's own rendering of the cell states.

# A cell the corpus is too short for is not the scheme's limit: the table marks it n/m (`report.tables.cell_kind`)
# with its reason; this line says what to do about it.
SHORT_CORPUS_HINT = (
    "n/m where the corpus is too short: score a longer one (files named with data=text 'data.paths=[FILE]' are "
    "scored whole)"
)


def short_corpus_lines(results: Results) -> list[str]:
    """The hint line when a cell had too few tokens for one window (`results.cell_status` too_few_tokens)."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.evaluation.results import TOO_FEW_TOKENS, cell_status

    short = any(cell_status(e) == TOO_FEW_TOKENS for r in results for e in r["entries"])
    return [SHORT_CORPUS_HINT] if short else []


def _label(result: dict[str, Any]) -> str:
    return str(result["label"])


def positions_lines(results: Results, label: Callable[[dict[str, Any]], str]) -> list[str]:
    """A line for each run fed randomized positions (the table's title does not say it)."""
    lines = []
    for r in results:
        drawn = {
            (p["range"], p["seed"]) for e in r["entries"] if (p := e.get("positions") or {}).get("mode") == "random"
        }
        for m, seed in sorted(drawn):
            lines.append(
                f"positions: {label(r)} fed per window sorted random draws from [0, {m}) (seed {seed}; its "
                "train.random_positions, as in training); --positions sequential feeds 0..T-1"
            )
    return lines


# ----------------------------------------------------------------------------------------------------------------
# The commands.


@app.command(
    "eval-extrapolate",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    epilog=_EXAMPLES,
)
@handles_errors
def eval_extrapolate_command(
    args: Annotated[
        list[str] | None,
        typer.Argument(
            help="Run or sweep directories (runs are found recursively), then optional data overrides "
            "to score every run on another corpus with its own tokenizer: data=text data.paths=[FILE] scores FILE "
            "whole (add data.val_fraction=F to score its held-out tail instead).",
            metavar="RUN_DIR... [DATA OVERRIDES]",
            show_default=False,
        ),
    ] = None,
    lengths: Annotated[
        str | None, _option("Multiples of each run's base length, e.g. 0.5,1,2,4,8,16 (the default).")
    ] = None,
    abs_lengths: Annotated[str | None, _option("Absolute lengths in tokens instead, e.g. 128,512,2048.")] = None,
    protocol: Annotated[
        str | None,
        _option(
            "nonoverlap (score every token; default), sliding (score the last --stride tokens), fixed-target "
            "(score the same last --target tokens at every length, with more context before them) or streaming "
            "(StreamingLLM's KV-cache decoding: each token sees the first --sinks tokens and its --window most "
            "recent ones, their K/V as first computed, at positions inside that cache; --stride tokens per forward, "
            "default 1)."
        ),
    ] = None,
    stride: Annotated[
        int | None,
        _option("Sliding: tokens scored per window (default L/2). Streaming: tokens read per forward (default 1)."),
    ] = None,
    target: Annotated[
        int | None, _option("Fixed-target protocol: tokens scored per window (default: the base length).")
    ] = None,
    window: Annotated[
        int | None,
        _option("Streaming: recent tokens each token sees, at least (default: base length - sinks - stride + 1)."),
    ] = None,
    sinks: Annotated[
        int | None,
        _option("Streaming: first tokens of each stream kept (attention sinks; default 4, 0 = none)."),
    ] = None,
    tokens: Annotated[int | None, _option("Scored tokens per length (default 16384).")] = None,
    batch_tokens: Annotated[int | None, _option("Tokens per forward batch (memory bound; default 16384).")] = None,
    dtype: Annotated[
        str | None, _option("auto (bf16 if the run trained in bf16 and this device runs bf16 fast), fp32 or bf16.")
    ] = None,
    positions: Annotated[
        str | None,
        _option(
            "random (sorted draws from [0, M) per window, for runs trained with train.random_positions=M: their "
            "default) or sequential (0..T-1: every other run's default)."
        ),
    ] = None,
    positions_seed: Annotated[int, typer.Option(help="Seed of the random position draws.")] = 0,
    train_length: Annotated[
        int | None,
        _option("transformers directories: the training length (default: from config.json).", "--train-length"),
    ] = None,
    device: DeviceOption = "auto",
    threads: ThreadsOption = 0,
    force: Annotated[bool, _force_option("eval/extrapolate.json")] = False,
    plot: Annotated[
        Path | None,
        _option("Write a PNG of perplexity vs length here, and <stem>_per_position.png next to it.", dir_okay=False),
    ] = None,
    json_path: JsonOption = None,
) -> None:
    """Perplexity at and beyond the training length, per run and length; stored in each run's eval/extrapolate.json."""
    # deferred: keeps matplotlib and this command's modules off posenc --help start-up
    from posenc_cli.analysis import api
    from posenc_cli.report.plots import write_plots
    from posenc_cli.report.tables import extrapolation_table

    paths, overrides = split_args(args)
    _check_run_args(paths, [p for p in paths if p.startswith("-")], "unknown option", "eval-extrapolate")
    cfg = build_eval_config(
        lengths=lengths,
        abs_lengths=abs_lengths,
        protocol=protocol,
        stride=stride,
        target=target,
        window=window,
        sinks=sinks,
        tokens=tokens,
        batch_tokens=batch_tokens,
        dtype=dtype,
        force=force,
    )
    evaluation, seconds = _evaluate_timed(
        "windows",
        lambda display: api.evaluate(
            paths,
            config=cfg,
            data_overrides=overrides,
            positions=positions,
            positions_seed=positions_seed,
            train_length=train_length,
            device=device,
            threads=threads,
            progress=display.progress,
            on_run=display.on_run,
            on_skip=display.on_skip,
        ),
    )
    results = evaluation.results
    _report(
        results,
        seconds,
        table=extrapolation_table(results, by=evaluation.by, label=_label),
        notes=[*short_corpus_lines(results), *positions_lines(results, _label)],
        results_file="eval/extrapolate.json",
        plot=plot,
        write_plot=lambda path: write_plots(results, path),
        json_path=json_path,
        combined=evaluation.to_json(),
    )


_PASSKEY_EXAMPLES = """
[bold]Examples[/]

  posenc train data=passkey tokenizer=bpe tokenizer.vocab_size=512 data.passkey_max_len=512 train.steps=1200 --out pk
  posenc eval-passkey pk --lengths 1,2,4,8 --plot passkey.png  [dim](trained as `posenc sweep passkey` trains)[/]
  posenc eval-passkey outputs/sweeps/passkey --depths 0,0.5,1 --trials 20
  posenc eval-passkey RUN --abs-lengths 128,512,2048 --json passkey_all.json
"""


@app.command("eval-passkey", epilog=_PASSKEY_EXAMPLES)
@handles_errors
def eval_passkey_command(
    paths: Annotated[
        list[str] | None,
        typer.Argument(
            help="Run or sweep directories (runs are found recursively).", metavar="RUN_DIR...", show_default=False
        ),
    ] = None,
    lengths: Annotated[
        str | None, _option("Prompt lengths as multiples of each run's base length (default 1,2,4,8).")
    ] = None,
    abs_lengths: Annotated[str | None, _option("Absolute prompt lengths in tokens instead, e.g. 128,512.")] = None,
    depths: Annotated[
        str | None, _option("Key depths: share of the filler before the key (default 0,0.25,0.5,0.75,1).")
    ] = None,
    trials: Annotated[int, typer.Option(help="Prompts (fresh keys) per length × depth.")] = 10,
    digits: Annotated[int | None, _option("Digits per key (default: the run's data.passkey_digits, 5).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the keys (the same seed gives the same prompts).")] = 0,
    batch_tokens: Annotated[int, typer.Option(help="Prompt tokens per forward batch (memory bound).")] = 16384,
    dtype: Annotated[
        str, typer.Option(help="auto (bf16 if the run trained in bf16 and it is fast here), fp32, bf16.")
    ] = "auto",
    device: DeviceOption = "auto",
    threads: ThreadsOption = 0,
    force: Annotated[bool, _force_option("eval/passkey.json")] = False,
    plot: Annotated[Path | None, _option("Write a PNG heatmap (length × depth per run) here.", dir_okay=False)] = None,
    json_path: JsonOption = None,
) -> None:
    """Passkey retrieval: exact match of a key hidden at each depth of growing prompts; in RUN/eval/passkey.json."""
    # deferred: keeps matplotlib and this command's modules off posenc --help start-up
    from posenc_cli.analysis import api
    from posenc_cli.evaluation.passkey import combined_json
    from posenc_cli.report.passkey_report import passkey_figure, passkey_table
    from posenc_cli.report.plots import save_figure

    paths = paths or []
    _check_run_args(paths, [p for p in paths if p.startswith("-") or "=" in p], "unexpected argument", "eval-passkey")
    _one_kind_of_lengths(lengths, abs_lengths)  # before either list is parsed
    results, seconds = _evaluate_timed(
        "prompts",
        lambda display: api.evaluate_passkey(
            paths,
            lengths=_optional_list(lengths, float, "--lengths"),
            abs_lengths=_optional_list(abs_lengths, int, "--abs-lengths"),
            depths=_optional_list(depths, float, "--depths"),
            trials=trials,
            digits=digits,
            seed=seed,
            batch_tokens=batch_tokens,
            dtype=dtype,
            device=device,
            threads=threads,
            force=force,
            progress=display.progress,
            on_run=display.on_run,
        ),
    )
    _report(
        results,
        seconds,
        table=passkey_table(results),
        results_file="eval/passkey.json",
        plot=plot,
        write_plot=lambda path: [save_figure(passkey_figure(results), path)],
        json_path=json_path,
        combined=combined_json(results),
    )
