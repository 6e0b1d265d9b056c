"""`posenc eval-algorithmic`: exact match per algorithmic task × instance length (Kazemnejad et al. 2023;
`evaluation.algorithmic`), in distribution (<= L) next to beyond it (L+1..2L)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from posenc_cli.bounds import check
from posenc_cli.cli.app import app, handles_errors
from posenc_cli.cli.eval_shared import (
    DeviceOption,
    JsonOption,
    ThreadsOption,
    check_run_args,
    evaluate_timed,
    force_option,
    option,
    parse_list,
    report,
)
from posenc_cli.errors import ConfigError
from posenc_cli.report.gate import DEFAULT_COMPETENCE
from posenc_cli.run.device import resolve_device

if TYPE_CHECKING:
    from rich.table import Table

    from posenc_cli.evaluation.algorithmic import TaskSummary

_EXAMPLES = """
[bold]Examples[/]

  posenc train data=algorithmic 'data.tasks=\\[copy,reverse]' data.max_length=20 --out alg
  posenc eval-algorithmic alg                       [dim](the run's tasks at 1..2L, L = its data.max_length)[/]
  posenc eval-algorithmic alg --tasks copy --lengths 1-40 --examples 500
  posenc eval-algorithmic outputs/sweeps/algorithmic --json algorithmic.json
  posenc eval-algorithmic alg --competence 0.95   [dim](flag tasks below 95% exact match in distribution)[/]
"""


def parse_lengths(text: str) -> list[int]:
    """'1-5,8,10-12' -> [1, 2, 3, 4, 5, 8, 10, 11, 12]: instance lengths in [1, 2·MAX_LENGTH], ranges inclusive."""
    # deferred: keeps the task generators off posenc --help start-up
    from posenc_cli.data.algorithmic.base import MAX_LENGTH

    longest = 2 * MAX_LENGTH  # AlgorithmicEvalConfig.validate's bound
    lengths: list[int] = []
    for part in (p for p in text.replace(" ", "").split(",") if p):
        low, dash, high = part.partition("-")
        if dash and low and high:
            a, b = parse_list(low, int, "--lengths")[0], parse_list(high, int, "--lengths")[0]
            if b < a:
                raise ConfigError(f"--lengths {text!r}: range {part} runs backwards")
            check(b, f"--lengths {part}: the longest length", 1, longest, integer=True)  # before the list is built
            lengths += range(a, b + 1)
        else:
            lengths += parse_list(part, int, "--lengths")
    if not lengths:
        raise ConfigError("--lengths needs at least one length, e.g. --lengths 1-40")
    if min(lengths) < 1:
        raise ConfigError(f"--lengths must be instance lengths >= 1, got {min(lengths)}")
    check(max(lengths), "--lengths: the longest length", 1, longest, integer=True)
    return sorted(set(lengths))


def _percent(value: float | None) -> Any:
    # deferred: keeps this command's modules off posenc --help start-up
    from rich.text import Text

    from posenc_cli.report.passkey_report import _ink, accuracy_colour

    if value is None or math.isnan(value):
        return Text("n/a", style="dim")
    return Text(f"{value * 100:.0f}", style=f"bold {_ink(value)} on {accuracy_colour(value)}")


def _gates(result: dict[str, Any], competence: float) -> dict[str, Any]:
    """Task -> the competence gate of one run's result doc (`evaluation.competence`)."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.analysis.task_results import result_competence

    tasks = dict.fromkeys(str(e["task"]) for e in result["entries"])
    return {t: result_competence(result, t, "algorithmic", competence) for t in tasks}


def run_tables(results: Sequence[dict[str, Any]], competence: float = DEFAULT_COMPETENCE) -> list[Table]:
    """One table per run: rows = tasks, columns = instance lengths (exact-match %), then the means in distribution
    (lengths <= L) and beyond (L+1..2L), and the competence gate's verdict at `competence` (a task the run did not
    learn in distribution, or was never trained on, is marked: its beyond-L numbers measure no learned skill)."""
    # deferred: keeps this command's modules off posenc --help start-up
    from rich.table import Table

    from posenc_cli.evaluation.algorithmic import summarize
    from posenc_cli.report.gate import NOT_TRAINED, gate_note, state_cell
    from posenc_cli.report.tables import fit_to_content, run_label

    tables = []
    for r in results:
        summaries = summarize(r["entries"])
        if not summaries:
            continue
        gates = _gates(r, competence)
        lengths = sorted({n for s in summaries for n in s.accuracy})
        limit = summaries[0].max_length
        examples = sorted({int(e["examples"]) for e in r["entries"]})
        table = Table(title=run_label(r), title_justify="left", caption_justify="left", header_style="bold")
        table.add_column("task", no_wrap=True)
        for n in lengths:
            table.add_column(str(n), justify="right", no_wrap=True, style="dim" if n > limit else "")
        table.add_column("≤L", justify="right", no_wrap=True)
        table.add_column("L+1..2L", justify="right", no_wrap=True)
        table.add_column("gate", no_wrap=True)
        for s in summaries:
            cells = [_percent(s.accuracy.get(n)) if n in s.accuracy else "" for n in lengths]
            table.add_row(
                s.task, *cells, _percent(s.in_distribution), _percent(s.beyond), state_cell(gates[s.task].status)
            )
        reasons = sorted({str(e["reason"]) for e in r["entries"] if e.get("status") != "ok" and e.get("reason")})
        if all(g.status == NOT_TRAINED for g in gates.values()):  # L is the asked (or the paper's) length, not its own
            where = f"L = {limit} (asked; ⊘ not trained on this task: the run never trained on these tasks)"
        else:
            spans = sorted({g.lengths for g in gates.values() if g.lengths is not None})
            trained = ", ".join(f"{lo}..{hi}" for lo, hi in spans) or f"<= {limit}"
            where = f"L = {limit} (trained on lengths {trained}: the ≤L column)"
        table.caption = "\n".join(
            [
                f"Exact-match accuracy (%) of greedy answers per instance length; {where}; "
                f"{'/'.join(map(str, examples))} examples per cell.",
                gate_note(competence),
                *(f"n/a: {reason}" for reason in reasons),
            ]
        )
        tables.append(fit_to_content(table))
    return tables


def summary_table(results: Sequence[dict[str, Any]], competence: float = DEFAULT_COMPETENCE) -> Table | None:
    """Many runs at a glance: rows = runs, columns = tasks, cells = in-distribution / beyond-L mean accuracy, with the
    competence gate's mark (at `competence`) after a task the run did not learn or never trained on."""
    # deferred: keeps this command's modules off posenc --help start-up
    from rich.table import Table
    from rich.text import Text

    from posenc_cli.evaluation.algorithmic import summarize
    from posenc_cli.report.gate import GATE_MARK, GATE_STYLE, gate_note, is_flagged
    from posenc_cli.report.tables import LABEL_MAX_WIDTH, fit_to_content, run_label

    rows: list[tuple[str, dict[str, TaskSummary], dict[str, Any]]] = []
    for r in results:
        rows.append((run_label(r), {s.task: s for s in summarize(r["entries"])}, _gates(r, competence)))
    tasks = list(dict.fromkeys(t for _, by_task, _ in rows for t in by_task))
    if len(rows) < 2 or not tasks:
        return None
    table = Table(title="≤L / L+1..2L exact match (%)", title_justify="left", header_style="bold")
    table.caption, table.caption_justify = gate_note(competence), "left"
    table.add_column("run", no_wrap=True, overflow="ellipsis", max_width=LABEL_MAX_WIDTH)
    for t in tasks:
        table.add_column(t, justify="center", no_wrap=True)
    for label, by_task, gates in rows:
        cells: list[Any] = [label]
        for t in tasks:
            s = by_task.get(t)
            if s is None:
                cells.append("")
                continue
            status = gates[t].status
            mark = Text(f" {GATE_MARK[status]}", style=GATE_STYLE[status]) if is_flagged(status) else ""
            cells.append(Text.assemble(_percent(s.in_distribution), " / ", _percent(s.beyond), mark))
        table.add_row(*cells)
    return fit_to_content(table)


@app.command("eval-algorithmic", epilog=_EXAMPLES)
@handles_errors
def eval_algorithmic_command(
    paths: Annotated[
        list[str] | None,
        typer.Argument(
            help="Run or sweep directories (runs are found recursively).", metavar="RUN_DIR...", show_default=False
        ),
    ] = None,
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
    batch_tokens: Annotated[int, typer.Option(help="Prompt tokens per forward batch (memory bound).")] = 16384,
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
    json_path: JsonOption = None,
) -> None:
    """Algorithmic tasks (copy, reverse, addition, ...) per instance length; accuracy stored in
    RUN/eval/algorithmic.json."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.data.algorithmic import task_class
    from posenc_cli.evaluation.algorithmic import AlgorithmicEvalConfig, combined_json, evaluate_algorithmic_paths
    from posenc_cli.evaluation.competence import check_threshold

    paths = paths or []
    check_run_args(paths, "eval-algorithmic")
    names = parse_list(tasks, str, "--tasks") if tasks is not None else None
    for name in names or ():
        task_class(name, "task")
    cfg = AlgorithmicEvalConfig(
        tasks=names,
        lengths=parse_lengths(lengths) if lengths is not None else None,
        max_length=max_length,
        examples=examples,
        seed=seed,
        batch_tokens=batch_tokens,
        dtype=dtype,
        force=force,
    )
    cfg.validate()
    check_threshold(competence)
    run_device = resolve_device(device, "--device")
    results, seconds = evaluate_timed(
        "examples",
        lambda display: evaluate_algorithmic_paths(
            paths, cfg, device=run_device, threads=threads, progress=display.progress, on_run=display.on_run
        ),
    )
    # deferred: keeps this command's modules off posenc --help start-up
    from rich.console import Group

    summary = summary_table(results, competence)
    report(
        results,
        seconds,
        table=Group(*run_tables(results, competence), *([summary] if summary is not None else [])),
        results_file="eval/algorithmic.json",
        plot=None,
        write_plot=lambda path: [],
        json_path=json_path,
        combined=combined_json(results),
    )


# ----------------------------------------------------------------------------------------------------------------
# Sweeps and `posenc compare`: the accuracies their runs already stored (one line to call after the perplexity table).


def stored_algorithmic_results(records: Sequence[Any]) -> list[dict[str, Any]]:
    """eval-algorithmic results read from disk for the runs of `compare.gather`'s records that have
    eval/algorithmic.json: the cells of the run's current checkpoint and of the current generator, under the record's
    label (`analysis.task_results.stored_algorithmic_results`). Failed jobs and runs without cells are left out."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.analysis.task_results import stored_algorithmic_results as stored

    return stored(records)


def print_algorithmic_summary(records: Sequence[Any], console: Any, competence: float = DEFAULT_COMPETENCE) -> None:
    """After a sweep's (or `compare`'s) perplexity table: in-distribution / beyond-L accuracy per run and task, with
    the competence gate at `competence`."""
    results = stored_algorithmic_results(records)
    table = summary_table(results, competence) if len(results) > 1 else (run_tables(results, competence) or [None])[0]
    if table is not None:
        console.print(table)
