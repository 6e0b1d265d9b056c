"""`posenc eval-tasks`: RULER-style retrieval tasks (`evaluation.tasks.retrieval`) per task × length × depth."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import typer

from posenc_cli.cli.app import app, handles_errors
from posenc_cli.cli.eval_shared import (
    DeviceOption,
    JsonOption,
    ThreadsOption,
    check_run_args,
    evaluate_timed,
    force_option,
    one_kind_of_lengths,
    option,
    parse_list,
    report,
    set_grid,
)
from posenc_cli.errors import ConfigError
from posenc_cli.report.effective_length import RULER_THRESHOLD, effective_length
from posenc_cli.report.gate import DEFAULT_COMPETENCE
from posenc_cli.run.device import resolve_device

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from rich.table import Table

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

SCORING_TEXT = {
    "contains": "share of expected answers contained (case-insensitive) in {generate} generated tokens (RULER's "
    "string_match_all)",
    "exact": "exact score (posenc's, stricter than RULER's): the continuation cut to the answer's tokens, exact match "
    "for one answer, else the share of answers in it",
}


EFFECTIVE_NOTE = (
    "Effective length (RULER): the longest length up to which the mean over depths stays >= {threshold} (--threshold; "
    "RULER's is Llama-2-7B's 85.6% at 4K); ≥ N: the longest measured length still passes; none: the shortest fails."
)


def scoring_of(entry: dict[str, Any]) -> str:
    """A stored cell's scoring (cells from before it was recorded were "exact")."""
    return str(entry.get("scoring", "exact"))


def scoring_note(entries: Sequence[dict[str, Any]]) -> str:
    """The caption's words for how these cells (of one scoring) were scored, with their generation budgets."""
    scoring = scoring_of(entries[0]) if entries else "contains"
    budgets = sorted({int(e["generate"]) for e in entries if e.get("generate") is not None})
    text = SCORING_TEXT.get(scoring, scoring).format(generate="/".join(map(str, budgets)) or "?")
    return text[:1].upper() + text[1:]


def depth_of(entry: dict[str, Any]) -> float | None:
    """A cell's depth; None for a task without depth (RULER's CWE, FWE)."""
    return None if entry.get("depth") is None else float(entry["depth"])


def depth_label(depth: float | None) -> str:
    return "—" if depth is None else f"{depth * 100:g}%"


def _depth_order(depth: float | None) -> float:
    return -1.0 if depth is None else depth


def length_scores(entries: Sequence[dict[str, Any]]) -> list[tuple[int, float | None]]:
    """(length, mean score over its depths) of one run × task × scoring; None where a depth is n/a."""
    by_length: dict[int, list[dict[str, Any]]] = {}
    for e in entries:
        by_length.setdefault(int(e["length"]), []).append(e)
    out: list[tuple[int, float | None]] = []
    for length, cells in sorted(by_length.items()):
        scores = [float(e["score"]) for e in cells if e.get("status") == "ok" and e.get("score") is not None]
        out.append((length, sum(scores) / len(scores) if scores and len(scores) == len(cells) else None))
    return out


def threshold_text(threshold: float) -> str:
    return f"{threshold * 100:.3g}%"


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


def _grid(
    result: dict[str, Any], task: str, scoring: str | None = None
) -> tuple[list[tuple[int, float]], list[float | None], np.ndarray, list[str]]:
    """((length, multiple) rows, depth columns, scores with NaN for n/a, n/a notes) of one run's task (the cells of
    `scoring` only, when given)."""
    entries = [e for e in result["entries"] if e["task"] == task and scoring in (None, scoring_of(e))]
    rows = sorted({(int(e["length"]), float(e["multiple"])) for e in entries})
    cols = sorted({depth_of(e) for e in entries}, key=_depth_order)
    grid = np.full((len(rows), len(cols)), np.nan)
    reasons: dict[str, list[str]] = {}
    for e in entries:
        i, j = rows.index((int(e["length"]), float(e["multiple"]))), cols.index(depth_of(e))
        if e.get("status") == "ok" and e.get("score") is not None:
            grid[i, j] = float(e["score"])
        elif str(e["length"]) not in reasons.setdefault(e.get("reason") or "not measured", []):
            reasons[e.get("reason") or "not measured"].append(str(e["length"]))
    return rows, cols, grid, [f"{', '.join(v)}: {k}" for k, v in reasons.items()]


def tasks_tables(
    results: Sequence[dict[str, Any]],
    tasks: Sequence[str],
    threshold: float = RULER_THRESHOLD,
    competence: float = DEFAULT_COMPETENCE,
) -> list[Table]:
    """One table per task: rows = run × length, columns = depths, their mean and (on a run's first row) the run's
    in-distribution score with the competence gate's verdict at `competence` (≤L) and RULER's effective length at
    `threshold` (marked for a run that did not learn the task); n/a dimmed with its reason."""
    # deferred: keeps this command's modules off posenc --help start-up
    from rich.table import Table
    from rich.text import Text

    from posenc_cli.analysis.task_results import result_competence
    from posenc_cli.report.gate import effective_cell, gate_cell, gate_note
    from posenc_cli.report.passkey_report import _ink, accuracy_colour
    from posenc_cli.report.tables import LABEL_MAX_WIDTH, fit_to_content, run_label

    tables = []
    for task, scoring in task_scorings(results, tasks):
        mine = [e for r in results for e in r["entries"] if e["task"] == task and scoring_of(e) == scoring]
        cols = sorted({depth_of(e) for e in mine}, key=_depth_order)
        trials = sorted({int(e["trials"]) for e in mine})
        title = f"{task} · {'RULER score' if scoring == 'contains' else 'exact score'}"
        table = Table(title=title, title_justify="left", caption_justify="left", header_style="bold")
        table.add_column("run", no_wrap=True, overflow="ellipsis", max_width=LABEL_MAX_WIDTH)
        table.add_column("length \\ depth", justify="right", no_wrap=True)
        for d in cols:
            table.add_column(depth_label(d), justify="center", no_wrap=True)
        table.add_column("mean", justify="right")
        table.add_column("≤L", justify="right", no_wrap=True)
        table.add_column(f"effective (≥ {threshold_text(threshold)})", justify="right", no_wrap=True)
        notes = []
        for n, r in enumerate(results):
            if n:
                table.add_section()
            rows, rcols, grid, reasons = _grid(r, task, scoring)
            own = [e for e in r["entries"] if e["task"] == task and scoring_of(e) == scoring]
            gate = result_competence(r, task, "retrieval", competence, scoring)
            effective = effective_cell(effective_length(length_scores(own), threshold).label, gate.status)
            for i, (length, multiple) in enumerate(rows):
                cells: list[Any] = [run_label(r) if i == 0 else "", f"{multiple:g}× · {length}"]
                for d in cols:
                    value = grid[i, rcols.index(d)] if d in rcols else math.nan
                    if math.isnan(value):
                        cells.append(Text("n/a", style="dim"))
                    else:
                        cells.append(Text(f" {value:.0%} ", style=f"bold {_ink(value)} on {accuracy_colour(value)}"))
                full = grid[i].size > 0 and not np.isnan(grid[i]).any()
                cells.append(f"{grid[i].mean():.0%}" if full else Text("n/a", style="dim"))
                cells.append(gate_cell(gate.status, gate.accuracy) if i == 0 else "")
                cells.append(effective if i == 0 else "")
                table.add_row(*cells)
            notes += [f"n/a for {run_label(r)} at {reason}" for reason in reasons]
        table.caption = "\n".join(
            [
                f"{scoring_note(mine)}, {'/'.join(map(str, trials))} trials per cell; columns: depth "
                "of the first needle or asked pair (—: a task without depth); rows: prompt + generated tokens.",
                f"≤L: the mean score at lengths up to the training length. {gate_note(competence)}",
                EFFECTIVE_NOTE.format(threshold=threshold_text(threshold)),
                *notes,
            ]
        )
        tables.append(fit_to_content(table))
    return tables


def task_scorings(results: Sequence[dict[str, Any]], tasks: Sequence[str]) -> list[tuple[str, str]]:
    """(task, scoring) pairs present in `results`, in the order of `tasks`, "contains" first."""
    present = {(e["task"], scoring_of(e)) for r in results for e in r["entries"]}
    return [(t, s) for t in tasks for s in ("contains", "exact") if (t, s) in present]


def tasks_figure(
    results: Sequence[dict[str, Any]], tasks: Sequence[str], competence: float = DEFAULT_COMPETENCE
) -> Figure:
    """Heatmaps: one row per run, one column per task (lengths × depths, RdYlGn from 0 to 1, n/a grey); the panel of
    a run that did not learn the task (competence gate at `competence`) or never trained on it is hatched over and
    says so in its title, with a legend entry per such state."""
    # deferred: keeps matplotlib and this command's modules off posenc --help start-up
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from posenc_cli.analysis.task_results import result_competence
    from posenc_cli.report.gate import gate_legend, mark_panel
    from posenc_cli.report.tables import run_label

    nrows, ncols = max(len(results), 1), max(len(tasks), 1)
    fig = Figure(figsize=(3.4 * ncols + 1.2, 2.7 * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    image = None
    states = []
    for a, r in enumerate(results):
        for b, task in enumerate(tasks):
            ax = axes[a, b]
            rows, cols, grid, _ = _grid(r, task)
            image = ax.imshow(np.ma.masked_invalid(grid), cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
            ax.set_facecolor("0.85")
            for (i, j), value in np.ndenumerate(grid):
                ax.text(j, i, "n/a" if math.isnan(value) else f"{value:.0%}", ha="center", va="center", fontsize=8)
            ax.set_xticks(range(len(cols)), [depth_label(d) for d in cols])
            ax.set_yticks(range(len(rows)), [f"{m:g}× · {n}" for n, m in rows])
            ax.set_title(f"{run_label(r)} · {task}", fontsize=9)
            scorings = {scoring_of(e) for e in r["entries"] if e["task"] == task}
            if scorings:
                scoring = "contains" if "contains" in scorings else "exact"
                states.append(result_competence(r, task, "retrieval", competence, scoring).status)
                mark_panel(ax, states[-1])
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), label="RULER score", shrink=0.9)
    gate_legend(fig, states, competence)
    return fig


@app.command("eval-tasks", epilog=_EXAMPLES)
@handles_errors
def eval_tasks_command(
    paths: Annotated[
        list[str] | None,
        typer.Argument(
            help="Run or sweep directories (runs are found recursively).", metavar="RUN_DIR...", show_default=False
        ),
    ] = None,
    tasks: Annotated[str | None, option("Comma-separated tasks (default: all of them).")] = None,
    lengths: Annotated[
        str | None, option("Prompt lengths as multiples of each run's base length (default 1,2,4,8).")
    ] = None,
    abs_lengths: Annotated[str | None, option("Absolute prompt lengths in tokens instead, e.g. 128,512.")] = None,
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
    batch_tokens: Annotated[int, typer.Option(help="Prompt tokens per forward batch (memory bound).")] = 16384,
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
    # deferred: keeps matplotlib and this command's modules off posenc --help start-up
    from posenc_cli.data.ruler import registry
    from posenc_cli.evaluation.competence import check_threshold
    from posenc_cli.evaluation.tasks.retrieval import (
        TasksEvalConfig,
        combined_json,
        evaluate_tasks_paths,
        registry_task,
    )
    from posenc_cli.report.plots import save_figure

    paths = paths or []
    check_run_args(paths, "eval-tasks")
    one_kind_of_lengths(lengths, abs_lengths)
    names = parse_list(tasks, str, "--tasks") if tasks is not None else list(registry())
    for name in names:
        registry_task(name)
    cfg = TasksEvalConfig(
        trials=trials,
        digits=digits,
        sizes=parse_sizes(sizes),
        scoring=scoring,
        tokens_to_generate=tokens_to_generate,
        seed=seed,
        haystack=haystack,
        batch_tokens=batch_tokens,
        dtype=dtype,
        force=force,
        threshold=threshold,
    )
    set_grid(cfg, lengths, abs_lengths, depths)
    cfg.validate()
    check_threshold(competence)
    run_device = resolve_device(device, "--device")
    results, seconds = evaluate_timed(
        "prompts",
        lambda display: evaluate_tasks_paths(
            paths, names, cfg, device=run_device, threads=threads, progress=display.progress, on_run=display.on_run
        ),
    )
    # deferred: keeps this command's modules off posenc --help start-up
    from rich.console import Group

    report(
        results,
        seconds,
        table=Group(*tasks_tables(results, names, threshold, competence)),
        results_file="eval/tasks.json",
        plot=plot,
        write_plot=lambda path: [save_figure(tasks_figure(results, names, competence), path)],
        json_path=json_path,
        combined=combined_json(results),
    )


# ----------------------------------------------------------------------------------------------------------------
# Sweeps and `posenc compare`: the retrieval scores their runs already stored, next to the perplexity table.


def stored_task_results(records: Sequence[Any]) -> list[dict[str, Any]]:
    """eval-tasks results read from disk for the runs of `compare.gather`'s records that have eval/tasks.json: the
    cells of the run's current checkpoint (the latest cell per task × length × depth), under the record's label
    (`analysis.task_results.stored_task_results`). Failed jobs and runs without retrieval cells are left out."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.analysis.task_results import stored_task_results as stored

    return stored(records)


def task_summary_tables(
    results: Sequence[dict[str, Any]], threshold: float = RULER_THRESHOLD, competence: float = DEFAULT_COMPETENCE
) -> list[Table]:
    """One compact table per task for many runs: rows = runs, columns = lengths, cells = the mean score over the
    measured depths (`posenc eval-tasks DIR` prints every depth), then the in-distribution score with the competence
    gate's verdict at `competence` (≤L) and RULER's effective length at `threshold`, marked for a run that did not
    learn the task."""
    # deferred: keeps this command's modules off posenc --help start-up
    from rich.table import Table
    from rich.text import Text

    from posenc_cli.analysis.task_results import result_competence
    from posenc_cli.data.ruler import registry
    from posenc_cli.report.gate import effective_cell, gate_cell, gate_note
    from posenc_cli.report.passkey_report import _ink, accuracy_colour
    from posenc_cli.report.tables import LABEL_MAX_WIDTH, fit_to_content, run_label

    tables = []
    for task, scoring in task_scorings(results, list(registry())):
        entries = [(r, e) for r in results for e in r["entries"] if e["task"] == task and scoring_of(e) == scoring]
        multiples = sorted({float(e["multiple"]) for _, e in entries})
        depths = sorted({depth_of(e) for _, e in entries}, key=_depth_order)
        trials = sorted({int(e["trials"]) for _, e in entries})
        name = "RULER score" if scoring == "contains" else "exact score"
        table = Table(title=f"{task} · {name}, mean over depths", title_justify="left", caption_justify="left")
        table.add_column("run", no_wrap=True, overflow="ellipsis", max_width=LABEL_MAX_WIDTH)
        for m in multiples:
            table.add_column(f"{m:g}×", justify="center", no_wrap=True)
        table.add_column("≤L", justify="right", no_wrap=True)
        table.add_column(f"effective (≥ {threshold_text(threshold)})", justify="right", no_wrap=True)
        for r in results:
            mine = [e for e in r["entries"] if e["task"] == task and scoring_of(e) == scoring]
            if not mine:
                continue
            cells: list[Any] = [run_label(r)]
            for m in multiples:
                at = [e for e in mine if float(e["multiple"]) == m]
                scores = [float(e["score"]) for e in at if e.get("status") == "ok" and e.get("score") is not None]
                if not at or len(scores) < len(at):
                    cells.append(Text("n/a", style="dim"))
                    continue
                value = sum(scores) / len(scores)
                cells.append(Text(f" {value:.0%} ", style=f"bold {_ink(value)} on {accuracy_colour(value)}"))
            gate = result_competence(r, task, "retrieval", competence, scoring)
            cells.append(gate_cell(gate.status, gate.accuracy))
            cells.append(effective_cell(effective_length(length_scores(mine), threshold).label, gate.status))
            table.add_row(*cells)
        table.caption = (
            f"{scoring_note([e for _, e in entries])}; depths {', '.join(map(depth_label, depths))}; "
            f"{'/'.join(map(str, trials))} trials per cell; n/a: a length the scheme cannot read or that cannot hold "
            "the prompt (reasons: posenc eval-tasks DIR). "
            + EFFECTIVE_NOTE.format(threshold=threshold_text(threshold))
            + f"\n≤L: the mean score at lengths up to the training length. {gate_note(competence)}"
        )
        tables.append(fit_to_content(table))
    return tables


def print_task_summary(
    records: Sequence[Any], console: Any, threshold: float = RULER_THRESHOLD, competence: float = DEFAULT_COMPETENCE
) -> None:
    """After a sweep's (or `compare`'s) perplexity table: the retrieval tables of the runs that have task cells, with
    RULER's effective length at `threshold` and the competence gate at `competence`; then the algorithmic summary
    of the runs that have algorithmic cells (`cli.algorithmic.print_algorithmic_summary`)."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.cli.algorithmic import print_algorithmic_summary

    for table in task_summary_tables(stored_task_results(records), threshold, competence):
        console.print(table)
    print_algorithmic_summary(records, console, competence)
