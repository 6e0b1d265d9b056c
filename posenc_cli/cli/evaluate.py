"""`posenc eval-extrapolate` (perplexity at and beyond the training length) and `posenc eval-passkey` (retrieval)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from posenc_cli.cli.app import app, console, err_console, handles_errors, split_args
from posenc_cli.errors import ConfigError

_EXAMPLES = """
[bold]Examples[/]

  posenc eval-extrapolate outputs/runs/rope-tiny outputs/runs/alibi-tiny --plot ppl.png
  posenc eval-extrapolate outputs/sweeps/schemes --lengths 1,2,4,8 --tokens 8192
  posenc eval-extrapolate RUN --protocol sliding --stride 64 --abs-lengths 256,1024
  posenc eval-extrapolate RUN data=text data.paths=\\[held_out.txt]   [dim](another corpus, each run's tokenizer)[/]
"""


def parse_list(text: str, kind: type, flag: str) -> list[Any]:
    """'0.5,1,2' -> [0.5, 1.0, 2.0]; one clear error for anything else."""
    try:
        values = [kind(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        noun = "integers" if kind is int else "numbers"
        raise ConfigError(f"{flag} {text!r}: expected comma-separated {noun}, e.g. {flag} 1,2,4") from None
    if not values:
        raise ConfigError(f"{flag} needs at least one value")
    return values


def build_eval_config(
    *,
    lengths: str | None,
    abs_lengths: str | None,
    protocol: str | None,
    stride: int | None,
    tokens: int | None,
    batch_tokens: int | None,
    dtype: str | None,
    force: bool,
) -> Any:
    """EvalConfig defaults updated with the flags that were given (type- and range-checked)."""
    import dataclasses

    from posenc_cli.config import EvalConfig, build_dataclass

    if lengths is not None and abs_lengths is not None:
        raise ConfigError("give either --lengths (multiples of the base length) or --abs-lengths (tokens), not both")
    raw = dataclasses.asdict(EvalConfig())
    given = {
        "lengths": parse_list(lengths, float, "--lengths") if lengths is not None else None,
        "abs_lengths": parse_list(abs_lengths, int, "--abs-lengths") if abs_lengths is not None else None,
        "protocol": protocol,
        "stride": stride,
        "tokens": tokens,
        "batch_tokens": batch_tokens,
        "dtype": dtype,
    }
    raw.update({k: v for k, v in given.items() if v is not None})
    raw["force"] = force
    cfg = build_dataclass(EvalConfig, raw, "eval")
    cfg.validate()
    if cfg.stride is not None and cfg.protocol != "sliding":
        raise ConfigError("--stride applies to --protocol sliding only (nonoverlap scores every token of a window)")
    return cfg


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
            "(data=text data.paths=[FILE]) to score every run on another corpus with its own tokenizer.",
            metavar="RUN_DIR... [DATA OVERRIDES]",
            show_default=False,
        ),
    ] = None,
    lengths: Annotated[
        str | None,
        typer.Option(
            help="Multiples of each run's base length, e.g. 0.5,1,2,4,8,16 (the default).", show_default=False
        ),
    ] = None,
    abs_lengths: Annotated[
        str | None, typer.Option(help="Absolute lengths in tokens instead, e.g. 128,512,2048.", show_default=False)
    ] = None,
    protocol: Annotated[
        str | None,
        typer.Option(
            help="nonoverlap (score every token; default) or sliding (score the last --stride tokens).",
            show_default=False,
        ),
    ] = None,
    stride: Annotated[
        int | None, typer.Option(help="Sliding protocol: tokens scored per window (default L/2).", show_default=False)
    ] = None,
    tokens: Annotated[
        int | None, typer.Option(help="Scored tokens per length (default 16384).", show_default=False)
    ] = None,
    batch_tokens: Annotated[
        int | None, typer.Option(help="Tokens per forward batch (memory bound; default 16384).", show_default=False)
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            help="auto (bf16 if the run trained in bf16 and this device runs bf16 fast), fp32 or bf16.",
            show_default=False,
        ),
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or mps.")] = "auto",
    threads: Annotated[int, typer.Option(help="CPU threads (0 = torch's default).")] = 0,
    force: Annotated[
        bool, typer.Option("--force", help="Recompute cells already stored in eval/extrapolate.json.")
    ] = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="Write a PNG of perplexity vs length here, and <stem>_per_position.png next to it.",
            show_default=False,
            dir_okay=False,
        ),
    ] = None,
    json_path: Annotated[
        Path | None,
        typer.Option(
            "--json", help="Write the combined results of all runs as JSON here.", show_default=False, dir_okay=False
        ),
    ] = None,
) -> None:
    """Perplexity at and beyond the training length, per run and length; stored in each run's eval/extrapolate.json."""
    from posenc_cli.evaluate import evaluate_paths
    from posenc_cli.fsutil import atomic_write_json
    from posenc_cli.plots import write_plots
    from posenc_cli.report import extrapolation_table

    paths, overrides = split_args(args)
    unknown = [p for p in paths if p.startswith("-")]
    if unknown:
        raise ConfigError(f"unknown option {unknown[0]} (see posenc eval-extrapolate --help)")
    if not paths:
        raise ConfigError("give at least one run directory (or a sweep directory holding runs)")
    cfg = build_eval_config(
        lengths=lengths,
        abs_lengths=abs_lengths,
        protocol=protocol,
        stride=stride,
        tokens=tokens,
        batch_tokens=batch_tokens,
        dtype=dtype,
        force=force,
    )

    start = time.perf_counter()
    with _Display() as display:
        results = evaluate_paths(
            paths,
            cfg,
            data_overrides=overrides,
            device=device,
            threads=threads,
            progress=display.progress,
            on_run=display.on_run,
        )
    seconds = time.perf_counter() - start

    by = "length" if cfg.abs_lengths is not None else "multiple"
    console.print(extrapolation_table(results, by=by))
    reused = sum(r["reused"] for r in results)
    cells = sum(len(r["entries"]) for r in results)
    note = f"; {reused} of {cells} cells reused from eval/extrapolate.json (--force recomputes)" if reused else ""
    console.print(f"{len(results)} run(s) evaluated in {seconds:.1f} s{note}", highlight=False)
    if plot is not None:
        for path in write_plots(results, plot):
            console.print(f"wrote {path}", highlight=False)
    if json_path is not None:
        combined = [{k: v for k, v in r.items() if k != "reused"} for r in results]
        atomic_write_json(json_path, {"schema_version": 1, "runs": combined})
        console.print(f"wrote {json_path}", highlight=False)


class _Display:
    """Live progress on a terminal (stderr); nothing otherwise, so piped output stays the table."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
            disable=not err_console.is_terminal,
        )
        self._task: Any = None
        self._run = ""

    def __enter__(self) -> _Display:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def on_run(self, path: Path, index: int, total: int) -> None:
        self._run = f"[{index + 1}/{total}] {path.name}"

    def progress(self, what: str, done: int, total: int) -> None:
        description = f"{self._run} {what} (windows)"
        if self._task is None:
            self._task = self._progress.add_task(description, total=total)
        self._progress.update(self._task, description=description, completed=done, total=total)


class _PasskeyDisplay(_Display):
    def progress(self, what: str, done: int, total: int) -> None:
        description = f"{self._run} {what} (prompts)"
        if self._task is None:
            self._task = self._progress.add_task(description, total=total)
        self._progress.update(self._task, description=description, completed=done, total=total)


_PASSKEY_EXAMPLES = """
[bold]Examples[/]

  posenc train data=passkey pos=alibi            [dim](short retrieval episodes at the training length)[/]
  posenc eval-passkey outputs/runs/alibi-tiny --lengths 1,2,4 --plot passkey.png
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
        str | None,
        typer.Option(
            help="Prompt lengths as multiples of each run's base length (default 1,2,4,8).", show_default=False
        ),
    ] = None,
    abs_lengths: Annotated[
        str | None, typer.Option(help="Absolute prompt lengths in tokens instead, e.g. 128,512.", show_default=False)
    ] = None,
    depths: Annotated[
        str | None,
        typer.Option(
            help="Key depths: share of the filler before the key (default 0,0.25,0.5,0.75,1).", show_default=False
        ),
    ] = None,
    trials: Annotated[int, typer.Option(help="Prompts (fresh keys) per length × depth.")] = 10,
    digits: Annotated[
        int | None, typer.Option(help="Digits per key (default: the run's data.passkey_digits, 5).", show_default=False)
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the keys (the same seed gives the same prompts).")] = 0,
    batch_tokens: Annotated[int, typer.Option(help="Prompt tokens per forward batch (memory bound).")] = 16384,
    dtype: Annotated[
        str, typer.Option(help="auto (bf16 if the run trained in bf16 and it is fast here), fp32, bf16.")
    ] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or mps.")] = "auto",
    threads: Annotated[int, typer.Option(help="CPU threads (0 = torch's default).")] = 0,
    force: Annotated[
        bool, typer.Option("--force", help="Recompute cells already stored in eval/passkey.json.")
    ] = False,
    plot: Annotated[
        Path | None,
        typer.Option(help="Write a PNG heatmap (length × depth per run) here.", show_default=False, dir_okay=False),
    ] = None,
    json_path: Annotated[
        Path | None,
        typer.Option(
            "--json", help="Write the combined results of all runs as JSON here.", show_default=False, dir_okay=False
        ),
    ] = None,
) -> None:
    """Passkey retrieval: exact match of a key hidden at each depth of growing prompts; in RUN/eval/passkey.json."""
    from posenc_cli.fsutil import atomic_write_json
    from posenc_cli.passkey import PasskeyConfig, combined_json, evaluate_passkey_paths, passkey_figure, passkey_table
    from posenc_cli.plots import save_figure

    unknown = [p for p in paths or [] if p.startswith("-") or "=" in p]
    if unknown:
        raise ConfigError(f"unexpected argument {unknown[0]} (see posenc eval-passkey --help)")
    if not paths:
        raise ConfigError("give at least one run directory (or a sweep directory holding runs)")
    if lengths is not None and abs_lengths is not None:
        raise ConfigError("give either --lengths (multiples of the base length) or --abs-lengths (tokens), not both")
    if dtype not in ("auto", "fp32", "bf16"):
        raise ConfigError(f"--dtype must be auto, fp32 or bf16, got {dtype!r}")
    cfg = PasskeyConfig(trials=trials, digits=digits, seed=seed, batch_tokens=batch_tokens, dtype=dtype, force=force)
    if lengths is not None:
        cfg.lengths = parse_list(lengths, float, "--lengths")
    if abs_lengths is not None:
        cfg.abs_lengths = parse_list(abs_lengths, int, "--abs-lengths")
    if depths is not None:
        cfg.depths = parse_list(depths, float, "--depths")
    cfg.validate()

    start = time.perf_counter()
    with _PasskeyDisplay() as display:
        results = evaluate_passkey_paths(
            paths, cfg, device=device, threads=threads, progress=display.progress, on_run=display.on_run
        )
    seconds = time.perf_counter() - start

    console.print(passkey_table(results))
    reused = sum(r["reused"] for r in results)
    cells = sum(len(r["entries"]) for r in results)
    note = f"; {reused} of {cells} cells reused from eval/passkey.json (--force recomputes)" if reused else ""
    console.print(f"{len(results)} run(s) evaluated in {seconds:.1f} s{note}", highlight=False)
    if plot is not None:
        console.print(f"wrote {save_figure(passkey_figure(results), plot)}", highlight=False)
    if json_path is not None:
        atomic_write_json(json_path, combined_json(results))
        console.print(f"wrote {json_path}", highlight=False)
