"""`posenc eval-extrapolate` (perplexity at and beyond the training length) and `posenc eval-passkey` (retrieval)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from posenc_cli import api
from posenc_cli.cli.app import app, handles_errors, split_args
from posenc_cli.cli.eval_shared import (
    AbsLengthsOption,
    BatchTokensOption,
    DeviceOption,
    JsonOption,
    LengthsOption,
    Results,
    RunDirsArgument,
    ThreadsOption,
    build_eval_config,
    check_run_args,
    evaluate_timed,
    force_option,
    one_kind_of_lengths,
    option,
    optional_list,
    report,
)
from posenc_cli.report.gate import DEFAULT_COMPETENCE

_EXAMPLES = """
[bold]Examples[/]

  posenc eval-extrapolate outputs/runs/rope-tiny outputs/runs/alibi-tiny --plot ppl.png
  posenc eval-extrapolate outputs/sweeps/schemes --lengths 1,2,4,8 --tokens 8192
  posenc eval-extrapolate RUN --protocol sliding --stride 64 --abs-lengths 256,1024
  posenc eval-extrapolate RUN --protocol fixed-target --target 128 --lengths 1,2,4,8   [dim](same tokens scored)[/]
  posenc eval-extrapolate RUN --protocol streaming --window 124 --sinks 4   [dim](StreamingLLM)[/]
  posenc eval-extrapolate RUN data=text data.paths=\\[held_out.txt]   [dim](a held-out file, scored whole)[/]
  posenc eval-extrapolate RUN --positions sequential   [dim](a train.random_positions run fed 0..T-1)[/]
  posenc eval-extrapolate SWEEP --longppl-evaluator SWEEP/train/pos=alibi   [dim](LongPPL, one evaluator's keys)[/]
"""


# ----------------------------------------------------------------------------------------------------------------
# eval-extrapolate's own rendering of the cell states.

# A cell the corpus is too short for is not the scheme's limit: the table marks it n/m (`report.tables.cell_kind`)
# with its reason; this line says what to do about it.
SHORT_CORPUS_HINT = (
    "n/m where the corpus is too short: score a longer one (files named with data=text 'data.paths=[FILE]' are "
    "scored whole)"
)


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
        str | None, option("Multiples of each run's base length, e.g. 0.5,1,2,4,8,16 (the default).")
    ] = None,
    abs_lengths: Annotated[str | None, option("Absolute lengths in tokens instead, e.g. 128,512,2048.")] = None,
    protocol: Annotated[
        str | None,
        option(
            "nonoverlap (score every token; default), sliding (score the last --stride tokens), fixed-target "
            "(score the same last --target tokens at every length, with more context before them) or streaming "
            "(StreamingLLM's KV-cache decoding: each token sees the first --sinks tokens and its --window most "
            "recent ones, their K/V as first computed, at positions inside that cache; --stride tokens per forward, "
            "default 1)."
        ),
    ] = None,
    stride: Annotated[
        int | None,
        option("Sliding: tokens scored per window (default L/2). Streaming: tokens read per forward (default 1)."),
    ] = None,
    target: Annotated[
        int | None, option("Fixed-target protocol: tokens scored per window (default: the base length).")
    ] = None,
    window: Annotated[
        int | None,
        option("Streaming: recent tokens each token sees, at least (default: base length - sinks - stride + 1)."),
    ] = None,
    sinks: Annotated[
        int | None,
        option("Streaming: first tokens of each stream kept (attention sinks; default 4, 0 = none)."),
    ] = None,
    tokens: Annotated[int | None, option("Scored tokens per length (default 16384).")] = None,
    batch_tokens: Annotated[int | None, option("Tokens per forward batch (memory bound; default 16384).")] = None,
    dtype: Annotated[
        str | None, option("auto (bf16 if the run trained in bf16 and this device runs bf16 fast), fp32 or bf16.")
    ] = None,
    positions: Annotated[
        str | None,
        option(
            "random (sorted draws from [0, M) per window, for runs trained with train.random_positions=M: their "
            "default) or sequential (0..T-1: every other run's default)."
        ),
    ] = None,
    positions_seed: Annotated[int, typer.Option(help="Seed of the random position draws.")] = 0,
    train_length: Annotated[
        int | None,
        option("transformers directories: the training length (default: from config.json).", "--train-length"),
    ] = None,
    device: DeviceOption = "auto",
    threads: ThreadsOption = 0,
    force: Annotated[bool, force_option("eval/extrapolate.json")] = False,
    longppl: Annotated[
        bool,
        typer.Option(
            "--longppl/--no-longppl",
            help="Measure LongPPL when --longppl-evaluator is given (--no-longppl: plain perplexity only).",
        ),
    ] = True,
    longppl_evaluator: Annotated[
        str | None,
        option(
            "LongPPL (perplexity over key tokens, Fang et al. 2025): the run that chooses the key tokens every run "
            "is scored on (default: none, no LongPPL).",
            "--longppl-evaluator",
            metavar="RUN",
        ),
    ] = None,
    plot: Annotated[
        Path | None,
        option("Write a PNG of perplexity vs length here, and <stem>_per_position.png next to it.", dir_okay=False),
    ] = None,
    json_path: JsonOption = None,
) -> None:
    """Perplexity at and beyond the training length, per run and length; stored in each run's eval/extrapolate.json."""
    # deferred: keeps matplotlib and this command's modules off posenc --help start-up
    from posenc_cli.report.plots import write_plots
    from posenc_cli.report.tables import extrapolation_table

    paths, overrides = split_args(args)
    check_run_args(paths, "eval-extrapolate", overrides=True)
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
        longppl=longppl,
    )
    evaluation, seconds = evaluate_timed(
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
            longppl_evaluator=longppl_evaluator,
            progress=display.progress,
            on_run=display.on_run,
            on_skip=display.on_skip,
        ),
    )
    results = evaluation.results
    report(
        results,
        seconds,
        table=extrapolation_table(results, by=evaluation.by, label=_label),
        notes=[*([SHORT_CORPUS_HINT] if evaluation.too_few_tokens else []), *positions_lines(results, _label)],
        results_file="eval/extrapolate.json",
        plot=plot,
        write_plot=lambda path: write_plots(results, path),
        json_path=json_path,
        write_json=evaluation.write_json,
    )


_PASSKEY_EXAMPLES = """
[bold]Examples[/]

  posenc train data=passkey tokenizer=bpe tokenizer.vocab_size=512 data.passkey_max_len=512 train.steps=1200 --out pk
  posenc eval-passkey pk --lengths 1,2,4,8 --plot passkey.png  [dim](trained as `posenc sweep passkey` trains)[/]
  posenc eval-passkey outputs/sweeps/passkey --depths 0,0.5,1 --trials 20
  posenc eval-passkey RUN --abs-lengths 128,512,2048 --json passkey_all.json
  posenc eval-passkey RUN --competence 0.8   [dim](flag runs below 80% at lengths <= the training length)[/]
"""


@app.command("eval-passkey", epilog=_PASSKEY_EXAMPLES)
@handles_errors
def eval_passkey_command(
    paths: RunDirsArgument = None,
    lengths: LengthsOption = None,
    abs_lengths: AbsLengthsOption = None,
    depths: Annotated[
        str | None, option("Key depths: share of the filler before the key (default 0,0.25,0.5,0.75,1).")
    ] = None,
    trials: Annotated[int, typer.Option(help="Prompts (fresh keys) per length × depth.")] = 10,
    digits: Annotated[int | None, option("Digits per key (default: the run's data.passkey_digits, 5).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the keys (the same seed gives the same prompts).")] = 0,
    batch_tokens: BatchTokensOption = 16384,
    dtype: Annotated[
        str, typer.Option(help="auto (bf16 if the run trained in bf16 and it is fast here), fp32, bf16.")
    ] = "auto",
    device: DeviceOption = "auto",
    threads: ThreadsOption = 0,
    force: Annotated[bool, force_option("eval/passkey.json")] = False,
    competence: Annotated[
        float,
        typer.Option(
            help="Competence gate: a run whose accuracy at lengths <= its training length is below this is marked "
            "'not learned' (its longer prompts measure no learned retrieval)."
        ),
    ] = DEFAULT_COMPETENCE,
    plot: Annotated[Path | None, option("Write a PNG heatmap (length × depth per run) here.", dir_okay=False)] = None,
    json_path: JsonOption = None,
) -> None:
    """Passkey retrieval: exact match of a key hidden at each depth of growing prompts; in RUN/eval/passkey.json."""
    # deferred: keeps matplotlib and this command's modules off posenc --help start-up
    from posenc_cli.report.passkey_report import passkey_figure, passkey_table
    from posenc_cli.report.plots import save_figure

    paths = paths or []
    check_run_args(paths, "eval-passkey")
    one_kind_of_lengths(lengths, abs_lengths)  # before either list is parsed
    evaluation, seconds = evaluate_timed(
        "prompts",
        lambda display: api.evaluate_passkey(
            paths,
            lengths=optional_list(lengths, float, "--lengths"),
            abs_lengths=optional_list(abs_lengths, int, "--abs-lengths"),
            depths=optional_list(depths, float, "--depths"),
            trials=trials,
            digits=digits,
            seed=seed,
            batch_tokens=batch_tokens,
            dtype=dtype,
            device=device,
            threads=threads,
            force=force,
            competence=competence,
            progress=display.progress,
            on_run=display.on_run,
        ),
    )
    results = evaluation.results
    gates = [(g["passkey"].status, g["passkey"].accuracy) for g in evaluation.gates]  # in distribution first
    report(
        results,
        seconds,
        table=passkey_table(results, gates, competence),
        results_file="eval/passkey.json",
        plot=plot,
        write_plot=lambda path: [save_figure(passkey_figure(results, gates, competence), path)],
        json_path=json_path,
        write_json=evaluation.write_json,
    )
