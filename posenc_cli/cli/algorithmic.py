"""`posenc eval-algorithmic`: exact match per algorithmic task × instance length (Kazemnejad et al. 2023;
`evaluation.algorithmic`), in distribution (<= L) next to beyond it (L+1..2L): the flags parsed, one call of
`api.evaluate_algorithmic`, its results drawn by `report.algorithmic_report`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from posenc_cli import api
from posenc_cli.cli.app import app, handles_errors
from posenc_cli.cli.eval_shared import (
    BatchTokensOption,
    DeviceOption,
    JsonOption,
    RunDirsArgument,
    ThreadsOption,
    check_run_args,
    evaluate_timed,
    force_option,
    option,
    optional_list,
    parse_list,
    report,
)
from posenc_cli.errors import ConfigError
from posenc_cli.report.gate import DEFAULT_COMPETENCE

_EXAMPLES = """
[bold]Examples[/]

  posenc train data=algorithmic 'data.tasks=\\[copy,reverse]' data.max_length=20 --out alg
  posenc eval-algorithmic alg                       [dim](the run's tasks at 1..2L, L = its data.max_length)[/]
  posenc eval-algorithmic alg --tasks copy --lengths 1-40 --examples 500
  posenc eval-algorithmic outputs/sweeps/algorithmic --json algorithmic.json
  posenc eval-algorithmic alg --competence 0.95   [dim](flag tasks below 95% exact match in distribution)[/]
  posenc eval-algorithmic outputs/sweeps/synthetic --plot synthetic.png   [dim](accuracy vs length, a panel per task)[/]
"""


def parse_lengths(text: str) -> list[int]:
    """'1-5,8,10-12' -> [1, 2, 3, 4, 5, 8, 10, 11, 12]: instance lengths in [1, 2·MAX_LENGTH], ranges inclusive."""
    lengths: list[int] = []
    for part in (p for p in text.replace(" ", "").split(",") if p):
        low, dash, high = part.partition("-")
        if dash and low and high:
            a, b = parse_list(low, int, "--lengths")[0], parse_list(high, int, "--lengths")[0]
            if b < a:
                raise ConfigError(f"--lengths {text!r}: range {part} runs backwards")
            api.check_instance_length(b, f"--lengths {part}: the longest length")  # before the list is built
            lengths += range(a, b + 1)
        else:
            lengths += parse_list(part, int, "--lengths")
    if not lengths:
        raise ConfigError("--lengths needs at least one length, e.g. --lengths 1-40")
    if min(lengths) < 1:
        raise ConfigError(f"--lengths must be instance lengths >= 1, got {min(lengths)}")
    api.check_instance_length(max(lengths), "--lengths: the longest length")
    return sorted(set(lengths))


@app.command("eval-algorithmic", epilog=_EXAMPLES)
@handles_errors
def eval_algorithmic_command(
    paths: RunDirsArgument = None,
    tasks: Annotated[str | None, option("Comma-separated tasks (default: the run's data.tasks, else all).")] = None,
    lengths: Annotated[
        str | None, option("Instance lengths, e.g. 1-40 or 1,10,20 (default: 1..2L, L = the run's data.max_length).")
    ] = None,
    max_length: Annotated[
        int | None, option("L, the longest training length (default: the run's data.max_length, else 20).")
    ] = None,
    examples: Annotated[
        int | None, option("Examples per task × length (default: the run's data.eval_examples, else 100).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the test examples (the same seed gives the same prompts).")] = 0,
    batch_tokens: BatchTokensOption = 16384,
    dtype: Annotated[str, typer.Option(help="auto, fp32 or bf16.")] = "auto",
    device: DeviceOption = "auto",
    threads: ThreadsOption = 0,
    force: Annotated[bool, force_option("eval/algorithmic.json")] = False,
    competence: Annotated[
        float,
        typer.Option(
            help="Competence gate: a task whose exact match over the training lengths is below this is marked 'not "
            "learned' (its beyond-L accuracy measures no learned skill)."
        ),
    ] = DEFAULT_COMPETENCE,
    plot: Annotated[
        Path | None,
        option(
            "Write accuracy against length here: a panel per task, a line per run (each task in its reference's "
            "measure: per-token for MQAR and flip-flop, exact match otherwise).",
            dir_okay=False,
        ),
    ] = None,
    json_path: JsonOption = None,
) -> None:
    """Algorithmic tasks (copy, reverse, addition, ...) per instance length; accuracy stored in
    RUN/eval/algorithmic.json."""
    # deferred: keeps this command's modules off posenc --help start-up
    from rich.console import Group

    from posenc_cli.report.algorithmic_report import run_tables, summary_table
    from posenc_cli.report.plots import figure_format

    paths = paths or []
    check_run_args(paths, "eval-algorithmic")
    if plot is not None:
        figure_format(plot)  # a format matplotlib cannot write, or an unwritable place, fails before any cell
    evaluation, seconds = evaluate_timed(
        "examples",
        lambda display: api.evaluate_algorithmic(
            paths,
            tasks=optional_list(tasks, str, "--tasks"),
            lengths=parse_lengths(lengths) if lengths is not None else None,
            max_length=max_length,
            examples=examples,
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
    results, gates = evaluation.results, evaluation.gates
    summaries = evaluation.summaries
    summary = summary_table(results, summaries, gates, competence)
    report(
        results,
        seconds,
        table=Group(*run_tables(results, summaries, gates, competence), *([summary] if summary is not None else [])),
        results_file="eval/algorithmic.json",
        plot=plot,
        write_plot=lambda path: [api.plot_accuracy_by_length(evaluation, path)],
        json_path=json_path,
        write_json=evaluation.write_json,
    )
