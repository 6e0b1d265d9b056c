"""`posenc compare` as data: `comparison` gathers runs and sweeps from disk and returns what the command shows (a
`CompareReport`); `compare` is its table as a pandas DataFrame."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from posenc_cli.analysis.compare import METRICS, Comparison, to_results, write_outputs
from posenc_cli.analysis.curves import curve_table
from posenc_cli.analysis.gather import gather
from posenc_cli.analysis.longppl_keys import keyed_records
from posenc_cli.errors import ConfigError, UserError
from posenc_cli.evaluation.competence import check_threshold
from posenc_cli.report.gate import DEFAULT_COMPETENCE

if TYPE_CHECKING:
    import pandas as pd

    from posenc_cli.analysis.rows import RunRecord
    from posenc_cli.perf.costs import RunCost
    from posenc_cli.report.reference_tables import ReferenceTable

__all__ = [
    "REFERENCES",
    "CompareReport",
    "TextTable",
    "compare",
    "comparison",
    "curve_view",
    "learning_curves",
    "reference_view",
    "task_scores",
    "task_seed_scores",
]

PathLike = str | Path


@dataclass(frozen=True)
class TextTable:
    """A table of ready text: a paper's numbers beside posenc's (`report.reference_tables.side_by_side`)."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    caption: str


@dataclass
class CompareReport:
    """What `posenc compare` shows: the comparison itself, and the extras asked for: a paper's table beside it
    (`reference`), the NoPE paper's MRR ranking (`mrr`: `analysis.mrr.nope_mrr`), each run's costs (`costs`); and the
    learning curves among the runs, when some differ only in their steps (`curves`); with `seed_mean`, the task cells
    over seeds (`task_seeds`: `task_seed_scores`' DataFrame)."""

    comparison: Comparison
    reference: TextTable | None = None
    mrr: pd.DataFrame | None = None
    costs: list[RunCost] | None = None
    curves: TextTable | None = None  # the learning curves among the runs (`curve_view`), None when there are none
    task_seeds: pd.DataFrame | None = None  # one row per experiment × task × scoring × length (`seed_mean`)


REFERENCES = ("nope-mrr",)  # besides `report.reference_tables.REFERENCE_TABLES`


def comparison(
    runs: Sequence[PathLike],
    *,
    metric: str = "ppl",
    baseline: str | None = None,
    all_lengths: bool = False,
    out: PathLike | None = None,
    reference: str | None = None,
    costs: bool = False,
    competence: float = DEFAULT_COMPETENCE,
    include_unlearned: bool = False,
    longppl_evaluator: PathLike | None = None,
    seed_mean: bool = False,
) -> CompareReport:
    """Gather the runs below `runs` (`analysis.gather.gather`) and compare them in `metric` (ppl, bpb, nll or
    longppl), divided by `baseline`'s row (a label or run directory); with `out`, write results.csv/json and the
    plots there (`analysis.compare.write_outputs`). `competence`: the competence gate's threshold (a run whose
    in-distribution accuracy on a task is below it is "not learned" in the task tables and left out of the NoPE-paper
    MRR unless `include_unlearned`; `evaluation.competence`). In LongPPL, only the cells scored on one evaluator's key
    tokens are shown: `longppl_evaluator`'s (a run directory), else the one the stored cells agree on
    (`analysis.longppl_keys`). `seed_mean`: the task tables over seeds, one row per experiment (`task_seed_scores`;
    `Comparison.seed_mean` for its CSV and markdown views; results.csv of `out` keeps a row per run). Every refusal
    comes before anything is written."""
    # deferred: perf and reference tables are only needed when asked for
    from posenc_cli.report.reference_tables import REFERENCE_TABLES, reference_table

    if not runs:
        raise UserError("give at least one run or sweep directory to compare")
    check_threshold(competence)
    if metric not in METRICS:
        raise UserError(f"--metric must be {', '.join(list(METRICS)[:-1])} or {list(METRICS)[-1]}, got {metric}")
    if longppl_evaluator is not None and metric != "longppl":
        raise UserError("--longppl-evaluator chooses the key tokens of --metric longppl; add --metric longppl")
    if out is not None:
        # deferred: only with --out
        from posenc_cli.report.output_files import check_writable_dir

        check_writable_dir(Path(out))  # before anything is gathered or written
    records = gather([Path(p) for p in runs], all_lengths=all_lengths)
    if metric == "longppl":
        records = keyed_records(records, longppl_evaluator)
    report = CompareReport(
        Comparison(records, metric=metric, baseline=baseline, competence=competence, seed_mean=seed_mean)
    )
    if seed_mean:
        report.task_seeds = report.comparison.task_seed_frame()
    report.curves = curve_view(report.comparison.curve_frame())
    if reference is not None and reference not in REFERENCES:
        if reference not in REFERENCE_TABLES:
            known = ", ".join([*REFERENCE_TABLES, *REFERENCES])
            raise ConfigError(f"--reference {reference}: unknown table (available: {known})")
        report.reference = reference_view(reference_table(reference), records)
    if reference == "nope-mrr":
        from posenc_cli.analysis.mrr import nope_mrr  # deferred: pandas

        report.mrr = nope_mrr([Path(p) for p in runs], competence=competence, include_unlearned=include_unlearned)
    if costs:
        from posenc_cli.perf.costs import run_costs  # deferred: only with --costs

        report.costs = run_costs((r.label, r.run_dir) for r in records)
    if out is not None:
        report.comparison.written = write_outputs(records, Path(out), competence)
    return report


def reference_view(table: ReferenceTable, records: list[RunRecord]) -> TextTable:
    """posenc's ppl(m·L)/ppl(L) next to the paper's, one row per run label (`reference_tables.side_by_side`)."""
    # deferred: only with --reference
    from posenc_cli.report.reference_tables import length_notes, side_by_side

    results = to_results(records)
    headers, rows = side_by_side(table, results)
    caption = "\n".join([table.citation, *length_notes(table, results)])
    return TextTable(f"ppl(L') / ppl(L): posenc / paper ({table.name})", headers, rows, caption)


def curve_view(frame: pd.DataFrame) -> TextTable | None:
    """The learning curves of `curve_frame` as a table (`analysis.curves.curve_table`), None for no curve."""
    if frame.empty:
        return None
    headers, rows, caption = curve_table(frame)
    return TextTable("Learning curves: in-distribution accuracy against training steps", headers, rows, caption)


def learning_curves(
    runs: Sequence[PathLike], *, competence: float = DEFAULT_COMPETENCE, all_lengths: bool = False
) -> pd.DataFrame:
    """The learning curves among the runs below `runs` as a DataFrame (`analysis.curves.curve_frame`): for runs whose
    saved configs are equal but for their training steps (a grid run and its pick's run at twice the steps, one seed),
    one row per curve × task × scoring × steps: in_distribution (the accuracy at the lengths the run trained on),
    competence (the gate's state at threshold `competence`), learned, run_dir. Empty when no two runs differ only in
    their steps (issue #38: a row below the gate at twice the chosen steps reads "not learned" with its curve)."""
    check_threshold(competence)
    return Comparison(gather([Path(p) for p in runs], all_lengths=all_lengths), competence=competence).curve_frame()


def task_scores(
    runs: Sequence[PathLike], *, competence: float = DEFAULT_COMPETENCE, all_lengths: bool = False
) -> pd.DataFrame:
    """The task cells the runs below `runs` stored (eval-tasks, eval-passkey, eval-algorithmic) as a DataFrame, one
    row per run × task × scoring (`analysis.task_results.task_frame`): in_distribution (the accuracy at the lengths
    the run trained on), competence (the gate's state at threshold `competence`: "learned", "not learned", "not
    trained on this task", "longer than its training examples", "cannot measure", "not measured"), learned (bool) and
    beyond (the mean beyond the training length). A flagged row keeps its numbers."""
    check_threshold(competence)
    return Comparison(gather([Path(p) for p in runs], all_lengths=all_lengths), competence=competence).task_frame()


def task_seed_scores(
    runs: Sequence[PathLike], *, competence: float = DEFAULT_COMPETENCE, all_lengths: bool = False
) -> pd.DataFrame:
    """The task cells the runs below `runs` stored, over seeds (`analysis.task_seeds.seed_frame`): one row per
    experiment (runs of one label whose saved configs differ only in train.seed; a run alone is n = 1) × task ×
    scoring × length, columns label, task, scoring, length, multiple, mean and sd (of the score over the seeds, as
    fractions; sd NaN for n = 1), n (seeds), measured (seeds that scored the length: the mean is NaN unless all did),
    n_learned (seeds past the gate at threshold `competence`), competence (the row's state: "learned" only when
    every seed is; a seed not trained on the task, longer than its training examples, or not measured gives the row
    that state, and where the seeds' states differ so there is no mean) and in_distribution (the seeds' mean)."""
    check_threshold(competence)
    return Comparison(gather([Path(p) for p in runs], all_lengths=all_lengths), competence=competence).task_seed_frame()


def compare(
    runs: Sequence[PathLike], *, metric: str = "ppl", baseline: str | None = None, all_lengths: bool = False
) -> pd.DataFrame:
    """The comparison table as a DataFrame (`Comparison.to_frame`): index "run" (row labels), column "n", then the
    mean `metric` per length and the ratio column; NaN where the table shows n/a, n/m or –. No run, or runs of
    which none holds a stored cell of `metric` (not evaluated yet), is a `UserError` rather than an empty frame."""
    frame = comparison(runs, metric=metric, baseline=baseline, all_lengths=all_lengths).comparison.to_frame()
    if not frame.drop(columns="n", errors="ignore").notna().to_numpy().any():
        names = ", ".join(map(str, runs))
        raise UserError(
            f"no {metric} cells stored below {names}: evaluate first (posenc eval-extrapolate, api.evaluate)"
        )
    return frame
