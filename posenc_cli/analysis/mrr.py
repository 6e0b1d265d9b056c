"""The NoPE paper's ranking of positional schemes as one number each: mean reciprocal rank over the algorithmic
tasks (Kazemnejad et al. 2023, arXiv 2305.19466, figure 1; `posenc compare --reference nope-mrr`).

How the reference computes it (McGill-NLP/length-generalization d06170e, `notebooks/plot_aggregate_final.ipynb`,
`get_mrr_df` and `compute_mean_reciprocal_rank`): a query is one (task, seed); its score per scheme is the exact-match
accuracy on the test split, which holds the lengths L+1..2L in equal numbers (`scripts/dataset_builders/
make_copy_dataset.py`: `test_min = max_length + 1`, `test_max = 2 * max_length`); within a query the schemes are
ranked with `rank(method="first", ascending=False)` and each scheme's MRR is the mean of 1/rank over the queries.
posenc follows that: a query's score is the mean of the per-length accuracies at L+1..2L (equal examples per length,
so the same as the split's accuracy), ties go to the scheme first in alphabetical order (the reference's order is
that of its result rows), and schemes are ranked among the pool being compared, by default the paper's five
(NoPE, T5, ALiBi, RoPE and absolute sinusoidal positions, the paper's "APE"), so that the numbers sit on the paper's
scale; `pool="all"` ranks every scheme found. A length a scheme cannot read (learned positions beyond their table)
scores 0: the scheme cannot answer there. Because ties decide ranks when many schemes score 0 beyond L, a second
column averages the ranks of tied schemes (`method="average"`) instead.

The spread is over seeds: the MRR of each seed's queries (its tasks), then their standard deviation.

The competence gate (issue #38; `evaluation.competence`): a run ranks in a query only when it learned the task in
distribution, its exact match over the training lengths at least `competence` (default 0.9), and it was trained on
the task; a scheme that never learned a task would otherwise win or lose its rank on beyond-L numbers that measure
nothing. Queries are those every scheme of the pool measured; within each, the runs that learned it are ranked among
themselves, and a scheme's MRR is the mean over the queries it ranked in (NaN for none). `DataFrame.attrs["per_task"]`
counts the runs included and excluded per task, `attrs["excluded"]` names them; `include_unlearned` ranks every run,
as the paper's notebook does.

`score="token"` ranks by per-token accuracy instead (the fraction of answer tokens right, the measure of Ruoss et
al. 2023, arXiv 2305.16843): posenc's addition, not the paper's, for models small enough that exact match beyond L
is 0 for every scheme and the ranks are decided by ties alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from posenc_cli.errors import UserError
from posenc_cli.evaluation.algorithmic import load_algorithmic_results
from posenc_cli.evaluation.competence import DEFAULT_COMPETENCE, algorithmic_competence, check_threshold, gate_status
from posenc_cli.evaluation.runs import find_runs
from posenc_cli.run.load import read_config
from posenc_cli.run.meta import incomplete_reason, is_hf_dir, read_meta

__all__ = ["PAPER_MRR", "SCORES", "QueryScore", "mrr_table", "nope_mrr", "query_scores", "reciprocal_ranks"]

# Figure 1 of Kazemnejad et al. 2023 (mean reciprocal rank over all tasks and seeds; "APE" is absolute sinusoidal).
PAPER_MRR: dict[str, float] = {"nope": 0.69, "t5": 0.55, "alibi": 0.50, "rope": 0.33, "sinusoidal": 0.22}
POOLS = ("paper", "all")


SCORES = ("exact", "token")


@dataclass(frozen=True)
class QueryScore:
    """One run's score on one task: mean exact-match accuracy over lengths <= L and over L+1..2L, and the same of
    per-token accuracy (None when a cell was stored before posenc measured it); n/a cells count as 0. `competence`
    and `trained`: what the competence gate reads (the exact match over the training lengths, n/a cells left out)."""

    scheme: str
    seed: int
    task: str
    max_length: int
    in_distribution: float
    beyond: float
    run: str
    token_in_distribution: float | None = None
    token_beyond: float | None = None
    competence: float | None = None  # the gate's accuracy (`evaluation.competence`); None: in_distribution's
    trained: bool = True  # whether the run's training data held the task


def _cell_settings(entry: dict[str, Any]) -> tuple[Any, ...]:
    """What must agree between the cells being ranked: examples, test seed, generator version, positions mode."""
    positions = entry.get("positions") or {}
    return (entry["examples"], entry["seed"], entry["generator"], positions.get("mode", "trained"))


def run_query_scores(run_dir: Path) -> tuple[list[QueryScore], set[tuple[Any, ...]]]:
    """The per-task scores of one run from its eval/algorithmic.json, and the settings of the cells used.

    UserError when the run is incomplete, has no algorithmic results, or misses a length of 1..2L of a task."""
    meta = read_meta(run_dir)
    reason = incomplete_reason(meta)
    if reason is not None:
        raise UserError(f"{run_dir}: {reason}; its accuracies would not be a finished model's")
    cfg = read_config(run_dir, meta)
    doc = load_algorithmic_results(run_dir)
    if doc is None or not doc.get("entries"):
        raise UserError(f"{run_dir}: no eval/algorithmic.json (run posenc eval-algorithmic on it first)")
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    for e in doc["entries"]:  # the file is in measurement order: the last entry of a cell wins
        latest[(str(e["task"]), int(e["length"]))] = e
    out: list[QueryScore] = []
    settings: set[tuple[Any, ...]] = set()
    for task in sorted({t for t, _ in latest}):
        cells = {n: e for (t, n), e in latest.items() if t == task}
        limit = int(next(iter(cells.values()))["train_max_length"])
        missing = [n for n in range(1, 2 * limit + 1) if n not in cells]
        if missing:
            raise UserError(
                f"{run_dir}: task {task} has no cell at length(s) {missing[:5]} of 1..{2 * limit} "
                "(run posenc eval-algorithmic on it)"
            )
        gate = algorithmic_competence(list(cells.values()), task, cfg.data)
        acc = {n: _accuracy(cells[n]) for n in range(1, 2 * limit + 1)}
        tok = {n: _accuracy(cells[n], "token_accuracy") for n in range(1, 2 * limit + 1)}
        settings.update(_cell_settings(cells[n]) for n in acc)
        inside, beyond = _halves(acc, limit)
        has_tokens = all(v is not None for v in tok.values())
        tok_inside, tok_beyond = _halves(tok, limit) if has_tokens else ([], [])
        out.append(
            QueryScore(
                scheme=str(cfg.pos.name),
                seed=int(cfg.train.seed),
                task=task,
                max_length=limit,
                in_distribution=sum(inside) / len(inside),
                beyond=sum(beyond) / len(beyond),
                run=str(run_dir),
                token_in_distribution=sum(tok_inside) / len(tok_inside) if has_tokens else None,
                token_beyond=sum(tok_beyond) / len(tok_beyond) if has_tokens else None,
                competence=gate.accuracy,
                trained=gate.status != "not trained on this task",
            )
        )
    return out, settings


def _accuracy(entry: dict[str, Any], name: str = "accuracy") -> float | None:
    """A cell's accuracy `name`; a cell the scheme cannot read (n/a) scores 0; None when a measured cell lacks it."""
    if entry.get("status") != "ok":
        return 0.0
    value = entry.get(name)
    return None if value is None else float(value)


def _halves(acc: dict[int, Any], limit: int) -> tuple[list[float], list[float]]:
    """The accuracies at lengths 1..L and at L+1..2L."""
    return [acc[n] for n in range(1, limit + 1)], [acc[n] for n in range(limit + 1, 2 * limit + 1)]


def query_scores(paths: Sequence[Path | str]) -> list[QueryScore]:
    """Scores of every posenc run below `paths` (transformers directories are skipped: they have no such results).

    UserError when the runs' cells were measured under different settings, or a (scheme, seed, task) repeats."""
    scores: list[QueryScore] = []
    settings: set[tuple[Any, ...]] = set()
    for run_dir in find_runs(paths):
        if is_hf_dir(run_dir):
            continue
        s, st = run_query_scores(run_dir)
        scores.extend(s)
        settings |= st
    if not scores:
        raise UserError("no run with algorithmic results found (posenc sweep algorithmic writes them)")
    if len(settings) > 1:
        raise UserError(
            "the runs' algorithmic cells were measured under different settings (examples, seed, generator, "
            f"positions): {sorted(settings, key=str)}; re-run posenc eval-algorithmic on all of them with one set of "
            "flags"
        )
    seen: dict[tuple[str, int, str], str] = {}
    for q in scores:
        key = (q.scheme, q.seed, q.task)
        if key in seen:
            raise UserError(f"two runs of {q.scheme}, seed {q.seed}, task {q.task}: {seen[key]} and {q.run}")
        seen[key] = q.run
    return scores


def reciprocal_ranks(frame: pd.DataFrame, method: str) -> pd.Series:
    """1/rank of each row's `beyond` score within its query (task, seed), highest first; rows must be sorted by
    scheme so that `method="first"` breaks ties alphabetically."""
    ranks = frame.groupby(["task", "seed"])["beyond"].rank(method=method, ascending=False)
    return 1.0 / ranks


def mrr_table(
    scores: Sequence[QueryScore],
    pool: str = "paper",
    score: str = "exact",
    *,
    competence: float = DEFAULT_COMPETENCE,
    include_unlearned: bool = False,
) -> pd.DataFrame:
    """One row per scheme of the pool, best MRR first: columns scheme, paper (the paper's MRR, NaN when it has none),
    mrr, mrr_sd (over seeds; NaN with one seed), mrr_ties_averaged, queries (those it was ranked in), not_learned
    (queries it was left out of by the gate), seeds, in_distribution and beyond (mean accuracies over all its
    measured queries), ties (ranked queries where its beyond-L score equals another ranked scheme's).

    Only queries (task, seed) that every scheme of the pool measured count; within each, only the runs that learned
    the task (the module docstring's gate at `competence`) are ranked unless `include_unlearned`. `DataFrame.attrs`:
    pool, queries, schemes, score, competence, include_unlearned, per_task {task: (included, excluded)} and excluded
    [(scheme, seed, task, in-distribution accuracy, state)]. `score="token"` ranks, and reports, per-token accuracies
    instead of exact match (the gate stays exact match: it asks whether the task was learned)."""
    if pool not in POOLS:
        raise UserError(f"pool must be one of {', '.join(POOLS)}, got {pool}")
    if score not in SCORES:
        raise UserError(f"score must be one of {', '.join(SCORES)}, got {score}")
    check_threshold(competence)
    frame = pd.DataFrame([vars(q) for q in scores])
    if score == "token":
        lacking = frame[frame["token_beyond"].isna()]
        if not lacking.empty:
            raise UserError(
                f"{lacking['run'].iloc[0]}: its cells hold no per-token accuracy (measured before posenc recorded it); "
                "run posenc eval-algorithmic on it again"
            )
    gate_accuracy = frame["competence"].where(frame["competence"].notna(), frame["in_distribution"])
    frame["state"] = [
        gate_status(None if pd.isna(a) else float(a), trained=bool(t), cells=1, threshold=competence)
        for a, t in zip(gate_accuracy, frame["trained"], strict=True)
    ]
    frame["gate_accuracy"] = gate_accuracy
    if score == "token":
        frame["in_distribution"], frame["beyond"] = frame["token_in_distribution"], frame["token_beyond"]
    if pool == "paper":
        frame = frame[frame["scheme"].isin(list(PAPER_MRR))]
        if frame.empty:
            raise UserError(f"none of the paper's schemes ({', '.join(PAPER_MRR)}) has algorithmic results")
    schemes = sorted(frame["scheme"].unique())
    if len(schemes) < 2:
        raise UserError(f"ranking needs two schemes or more, found {schemes}")
    complete = frame.groupby(["task", "seed"])["scheme"].nunique() == len(schemes)
    keep = set(complete[complete].index)
    frame = frame[[(t, s) in keep for t, s in zip(frame["task"], frame["seed"], strict=True)]]
    if frame.empty:
        raise UserError(f"no (task, seed) was measured for every scheme of {schemes}")
    frame = frame.sort_values(["task", "seed", "scheme"], kind="stable").reset_index(drop=True)
    frame["ranked"] = True if include_unlearned else frame["state"] == "learned"
    ranked = frame[frame["ranked"]].copy()
    ranked["rr"] = reciprocal_ranks(ranked, "first")
    ranked["rr_avg"] = reciprocal_ranks(ranked, "average")
    ranked["tied"] = ranked.groupby(["task", "seed"])["beyond"].transform(lambda s: s.duplicated(keep=False))
    rows = []
    for scheme, g in frame.groupby("scheme", sort=True):
        r = ranked[ranked["scheme"] == scheme]
        per_seed = r.groupby("seed")["rr"].mean().tolist()
        rows.append(
            {
                "scheme": scheme,
                "paper": PAPER_MRR.get(str(scheme), float("nan")),
                "mrr": float(r["rr"].mean()) if len(r) else float("nan"),
                "mrr_sd": statistics.stdev(per_seed) if len(per_seed) > 1 else float("nan"),
                "mrr_ties_averaged": float(r["rr_avg"].mean()) if len(r) else float("nan"),
                "queries": len(r),
                "not_learned": int((~g["ranked"]).sum()),
                "seeds": int(g["seed"].nunique()),
                "in_distribution": float(g["in_distribution"].mean()),
                "beyond": float(g["beyond"].mean()),
                "ties": int(r["tied"].sum()),
            }
        )
    table = pd.DataFrame(rows).sort_values(
        ["mrr", "scheme"], ascending=[False, True], kind="stable", na_position="last"
    )
    table = table.reset_index(drop=True)
    per_task = {
        str(task): (int(g["ranked"].sum()), int((~g["ranked"]).sum())) for task, g in frame.groupby("task", sort=True)
    }
    excluded = [
        (str(x.scheme), int(x.seed), str(x.task), None if pd.isna(x.gate_accuracy) else float(x.gate_accuracy), x.state)
        for x in frame[~frame["ranked"]].itertuples()
    ]
    table.attrs.update(
        pool=pool,
        queries=len(keep),
        schemes=schemes,
        score=score,
        competence=competence,
        include_unlearned=include_unlearned,
        per_task=per_task,
        excluded=excluded,
    )
    return table


def nope_mrr(
    paths: Sequence[Path | str],
    pool: str = "paper",
    score: str = "exact",
    *,
    competence: float = DEFAULT_COMPETENCE,
    include_unlearned: bool = False,
) -> pd.DataFrame:
    """`mrr_table` of the runs below `paths` (e.g. a `posenc sweep algorithmic` directory), ranking only the runs
    that learned each task (exact match over the training lengths >= `competence`) unless `include_unlearned`."""
    return mrr_table(
        query_scores(paths), pool=pool, score=score, competence=competence, include_unlearned=include_unlearned
    )
