"""`posenc eval-tasks`: RULER-style retrieval tasks (`evaluation.tasks.retrieval`) per task × length × depth: the
flags parsed, one call of `api.evaluate_tasks`, its results drawn by `report.retrieval_report`. Also what a sweep and
`compare` print after their table (`print_task_summary`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from posenc_cli import api
from posenc_cli.cli.app import app, handles_errors
from posenc_cli.cli.eval_shared import (
    AbsLengthsOption,
    BatchTokensOption,
    DeviceOption,
    JsonOption,
    LengthsOption,
    RunDirsArgument,
    ThreadsOption,
    check_run_args,
    evaluate_timed,
    force_option,
    one_kind_of_lengths,
    option,
    optional_list,
    report,
)
from posenc_cli.errors import ConfigError
from posenc_cli.report.effective_length import RULER_THRESHOLD
from posenc_cli.report.gate import DEFAULT_COMPETENCE

_EXAMPLES = """
[bold]Examples[/]

  posenc train data=tasks tokenizer=bpe tokenizer.vocab_size=512 data.max_len=512 train.steps=1200 --out tk
  posenc eval-tasks tk --tasks niah-multikey,variable-tracking --lengths 1,2,4,8 --depths 0,0.5,1 --trials 10
  posenc eval-tasks outputs/sweeps/tasks --plot tasks.png --json tasks_all.json
  posenc eval-tasks RUN --tasks niah-single --haystack corpus   [dim](real text from the run's corpus)[/]
  posenc eval-tasks RUN --scoring exact   [dim](posenc's stricter score: the answer's tokens, exact match)[/]
  posenc eval-tasks RUN --tokens-to-generate 32 --sizes keys=2,hops=2   [dim](smaller than RULER's)[/]
  posenc eval-tasks RUN --tasks common-words,frequent-words,kv-retrieval --abs-lengths 512,1024,2048
  posenc eval-tasks RUN --threshold 0.5   [dim](effective length: the longest length scoring >= 50%)[/]
  posenc eval-tasks RUN --competence 0.8   [dim](flag runs below 80% at lengths <= the training length)[/]
"""


def parse_sizes(text: str | None) -> dict[str, int] | None:
    """'keys=2,hops=3' -> {"keys": 2, "hops": 3}; one clear error for anything else."""
    if text is None:
        return None
    sizes: dict[str, int] = {}
    for part in (p for p in text.replace(" ", "").split(",") if p):
        name, eq, value = part.partition("=")
        if not eq or not value.lstrip("-").isdigit() or len(value) > 6:
            raise ConfigError(f"--sizes {text!r}: expected name=integer pairs, e.g. --sizes keys=2,hops=2")
        sizes[name.replace("-", "_")] = int(value)
    if not sizes:
        raise ConfigError("--sizes needs at least one name=integer pair")
    return sizes


@app.command("eval-tasks", epilog=_EXAMPLES)
@handles_errors
def eval_tasks_command(
    paths: RunDirsArgument = None,
    tasks: Annotated[str | None, option("Comma-separated tasks (default: all of them).")] = None,
    lengths: LengthsOption = None,
    abs_lengths: AbsLengthsOption = None,
    depths: Annotated[str | None, option("Depths of the first needle (default 0,0.5,1).")] = None,
    trials: Annotated[int, typer.Option(help="Episodes per task × length × depth.")] = 10,
    scoring: Annotated[
        str,
        typer.Option(
            help="contains: RULER's string_match_all (answers found, case-insensitive, in the generated tokens); "
            "exact: posenc's stricter exact match of the answer's tokens."
        ),
    ] = "contains",
    tokens_to_generate: Annotated[
        int | None,
        option(
            "Tokens generated per episode with --scoring contains; prompt + generated tokens = the length (default: "
            "the run's data.tokens_to_generate, else RULER's 128 NIAH / 30 VT)."
        ),
    ] = None,
    sizes: Annotated[
        str | None,
        option(
            "Episode sizes, e.g. keys=2,values=2,queries=2,hops=2,digits=4,vt_digits=4,letters=3; common=10,"
            "common_freq=6,uncommon_freq=1 (CWE), coded_letters=6 (FWE), hex_digits=8 (KV) (default: the run's "
            "data=tasks sizes, else RULER's 4 keys/values/queries/hops, 7 digits, VT 5 digits and 5 letters, CWE's "
            "short-context 10 words ×6 / others ×1, FWE 6 letters; KV 8 hex digits)."
        ),
    ] = None,
    digits: Annotated[int | None, option("Digits per NIAH value (default: see --sizes).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the episodes (the same seed gives the same prompts).")] = 0,
    haystack: Annotated[str, typer.Option(help="filler (repeated sentences) or corpus (the run's real text).")] = (
        "filler"
    ),
    batch_tokens: BatchTokensOption = 16384,
    dtype: Annotated[str, typer.Option(help="auto, fp32 or bf16.")] = "auto",
    device: DeviceOption = "auto",
    threads: ThreadsOption = 0,
    force: Annotated[bool, force_option("eval/tasks.json")] = False,
    threshold: Annotated[
        float,
        typer.Option(
            help="Effective length's threshold: the longest length whose mean score stays at or above it (RULER's: "
            "0.856, Llama-2-7B at 4K)."
        ),
    ] = RULER_THRESHOLD,
    competence: Annotated[
        float,
        typer.Option(
            help="Competence gate: a run scoring below this at lengths <= its training length is marked 'not "
            "learned' (its beyond-L scores measure no learned skill)."
        ),
    ] = DEFAULT_COMPETENCE,
    plot: Annotated[Path | None, option("Write a PNG heatmap (run × task) here.", dir_okay=False)] = None,
    json_path: JsonOption = None,
) -> None:
    """RULER-style retrieval and tracking tasks per length × depth; scores stored in RUN/eval/tasks.json."""
    # deferred: keeps this command's modules off posenc --help start-up
    from rich.console import Group

    from posenc_cli.report.plots import save_figure
    from posenc_cli.report.retrieval_report import tasks_figure, tasks_tables

    paths = paths or []
    check_run_args(paths, "eval-tasks")
    one_kind_of_lengths(lengths, abs_lengths)
    evaluation, seconds = evaluate_timed(
        "prompts",
        lambda display: api.evaluate_tasks(
            paths,
            tasks=optional_list(tasks, str, "--tasks"),
            lengths=optional_list(lengths, float, "--lengths"),
            abs_lengths=optional_list(abs_lengths, int, "--abs-lengths"),
            depths=optional_list(depths, float, "--depths"),
            trials=trials,
            digits=digits,
            sizes=parse_sizes(sizes),
            scoring=scoring,
            tokens_to_generate=tokens_to_generate,
            seed=seed,
            haystack=haystack,
            batch_tokens=batch_tokens,
            dtype=dtype,
            device=device,
            threads=threads,
            force=force,
            threshold=threshold,
            competence=competence,
            progress=display.progress,
            on_run=display.on_run,
        ),
    )
    results, names, gates = evaluation.results, evaluation.tasks, evaluation.gates
    report(
        results,
        seconds,
        table=Group(*tasks_tables(results, names, gates, threshold, competence)),
        results_file="eval/tasks.json",
        plot=plot,
        write_plot=lambda path: [save_figure(tasks_figure(results, names, gates, competence), path)],
        json_path=json_path,
        write_json=evaluation.write_json,
    )


# ----------------------------------------------------------------------------------------------------------------
# Sweeps and `posenc compare`: what every registered evaluation task adds after the perplexity table.


def print_task_summary(
    records: Sequence[Any], console: Any, threshold: float = RULER_THRESHOLD, competence: float = DEFAULT_COMPETENCE
) -> None:
    """After a sweep's (or `compare`'s) perplexity table: each registered evaluation task's summary of the runs that
    stored its cells (`api.task_summaries`: the retrieval tables with RULER's effective length at `threshold`, the
    passkey table, the algorithmic summary), each with the competence gate at `competence`."""
    for summary in api.task_summaries(records, threshold=threshold, competence=competence):
        for table in summary.tables:
            console.print(table)
