"""Task tables over seeds: one row per experiment (the seeds of one saved config, `rows.seed_clusters`) × task ×
scoring × length, the mean ± sample sd of the score over its seeds and how many seeds passed the competence gate.

The per-run cells are `task_results.task_rows` (a score per length, the mean over depths; each run's gate state and
in-distribution accuracy); the aggregation of one experiment's seeds is pure (`aggregate`), and never mixes
measures:

- a length is averaged only when every seed scored it: a seed whose cell there is n/a or missing makes the cell
  empty (`measured` says how many seeds scored it), never a mean over fewer seeds;
- the row's state (`row_state`) is "learned" only when every seed passed the gate, "not learned" when some seed did
  not; a seed in a state without a measure ("not trained on this task", "longer than its training examples",
  "cannot measure", "not measured", a seed with no cell of the task at all) gives the row that state; and where the
  seeds' states differ that way (`comparable`), the row has no mean at all, neither per length nor in distribution.

`seed_rows` returns plain rows (None where there is no number) for the report layer and the CSV view; `seed_frame`
turns them into a pandas DataFrame for the API.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from posenc_cli.analysis.rows import cluster_labels, seed_clusters
from posenc_cli.analysis.task_results import task_rows
from posenc_cli.evaluation.competence import check_threshold
from posenc_cli.report.gate import (
    BEYOND_TRAINING,
    CANNOT_MEASURE,
    DEFAULT_COMPETENCE,
    LEARNED,
    NOT_LEARNED,
    NOT_MEASURED,
    NOT_TRAINED,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SEED_COLUMNS", "Seed", "aggregate", "comparable", "mean_sd", "row_state", "seed_frame", "seed_rows"]

# One row per experiment × task × scoring × length. mean, sd, in_distribution: fractions (NaN in the frame where
# none); n: the experiment's seeds; measured: the seeds that scored this length; n_learned: the seeds past the gate.
SEED_COLUMNS = ["label", "task", "scoring", "length", "multiple", "mean", "sd", "n", "measured", "n_learned",
                "competence", "in_distribution"]  # fmt: skip

# The states without a measure, in the order one of them names a row whose seeds hold several: "not trained" first
# (as in `report.gate`), "not measured" last.
NO_MEASURE = (NOT_TRAINED, BEYOND_TRAINING, CANNOT_MEASURE, NOT_MEASURED)
FAMILY_ORDER = {"retrieval": 0, "passkey": 1, "algorithmic": 2}


@dataclass(frozen=True)
class Seed:
    """One seed's cells of a task × scoring: its gate state, its in-distribution accuracy (None: none measured) and
    length -> (multiple, score): the multiple None for algorithmic instance lengths, the score None for n/a."""

    competence: str = NOT_MEASURED  # the default: a seed without any cell of the task
    in_distribution: float | None = None
    scores: dict[int, tuple[float | None, float | None]] = field(default_factory=dict)


def mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
    """(mean, sample standard deviation) of one or more values; the sd is None for a single value (no spread)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def comparable(states: Sequence[str]) -> bool:
    """Whether seeds in these gate states may be averaged: all of them "learned" or "not learned" (a measure below or
    above the gate), or all in one and the same state."""
    return set(states) <= {LEARNED, NOT_LEARNED} or len(set(states)) == 1


def row_state(states: Sequence[str]) -> str:
    """The gate state of a row of seeds: "learned" when every seed learned the task, the first state without a
    measure that some seed is in (`NO_MEASURE`'s order), else "not learned"."""
    for state in NO_MEASURE:
        if state in states:
            return state
    return LEARNED if states and all(s == LEARNED for s in states) else NOT_LEARNED


def aggregate(label: str, task: str, scoring: str, seeds: Sequence[Seed]) -> list[dict[str, Any]]:
    """The rows of one experiment's seeds on one task × scoring, one per length any seed stored (`SEED_COLUMNS`; None
    where there is no number): the mean ± sd of the scores where every seed scored the length and the seeds'
    states are `comparable`; the row's state (`row_state`), its learned count and the mean in-distribution accuracy
    (only where every seed has one and the states are comparable)."""
    states = [s.competence for s in seeds]
    same = comparable(states)
    accuracies = [s.in_distribution for s in seeds]
    in_distribution = mean_sd([a for a in accuracies if a is not None])[0] if same and None not in accuracies else None
    common = {
        "label": label,
        "task": task,
        "scoring": scoring,
        "n": len(seeds),
        "n_learned": states.count(LEARNED),
        "competence": row_state(states),
        "in_distribution": in_distribution,
    }
    rows = []
    for length in sorted({n for s in seeds for n in s.scores}):
        cells = [s.scores[length] for s in seeds if length in s.scores]
        values = [score for _, score in cells if score is not None]
        mean, sd = mean_sd(values) if same and values and len(values) == len(seeds) else (None, None)
        multiple = next((m for m, _ in cells if m is not None), None)
        rows.append({**common, "length": length, "multiple": multiple, "mean": mean, "sd": sd, "measured": len(values)})
    return [{c: row[c] for c in SEED_COLUMNS} for row in rows]


def _family(row: dict[str, Any]) -> str:
    """Which evaluation a `task_rows` row comes from: algorithmic rows have no multiple, passkey's task is its own."""
    if row["multiple"] is None:
        return "algorithmic"
    return "passkey" if row["task"] == "passkey" else "retrieval"


def seed_rows(records: Sequence[Any], threshold: float = DEFAULT_COMPETENCE) -> list[dict[str, Any]]:
    """The records' stored task cells over seeds: every experiment (`rows.seed_clusters` of the records that did
    not fail, perplexity or none; labelled by `rows.cluster_labels`) × task × scoring × length, `aggregate`d, with
    the gate at `threshold`. Tasks in the order retrieval, passkey, algorithmic, then by name ("contains" before
    "exact"); experiments in the records' order. A run alone in its experiment is a row of n = 1."""
    check_threshold(threshold)
    runs = list(records)
    clusters = seed_clusters(runs, statuses={r.status for r in runs} - {"failed"})
    labels = cluster_labels(clusters)
    cluster_of = {str(r.run_dir): i for i, cluster in enumerate(clusters) for r in cluster}
    units: dict[tuple[int, str, str], dict[str, Seed]] = {}  # (cluster, task, scoring) -> run dir -> seed
    families: dict[tuple[str, str], str] = {}
    for row in task_rows(runs, threshold):
        i = cluster_of.get(row["run_dir"])
        if i is None:
            continue  # a failed job's: none are read
        families.setdefault((row["task"], row["scoring"]), _family(row))
        seeds = units.setdefault((i, row["task"], row["scoring"]), {})
        seed = seeds.setdefault(row["run_dir"], Seed(row["competence"], row["in_distribution"]))
        seed.scores[int(row["length"])] = (row["multiple"], row["score"])
    order = sorted(families, key=lambda k: (FAMILY_ORDER[families[k]], k[0], k[1] != "contains", k[1]))
    out = []
    for task, scoring in order:
        for i, cluster in enumerate(clusters):
            found = units.get((i, task, scoring))
            if found is not None:  # a seed without any cell of the task is "not measured" on it
                seeds = [found.get(str(r.run_dir), Seed()) for r in cluster]
                out += aggregate(labels[i], task, scoring, seeds)
    return out


def seed_frame(rows: Sequence[dict[str, Any]], threshold: float = DEFAULT_COMPETENCE) -> pd.DataFrame:
    """`seed_rows` (made at gate threshold `threshold`) as a DataFrame with columns `SEED_COLUMNS` (mean, sd,
    multiple, in_distribution: floats, NaN where none); `attrs["competence"]`: the threshold."""
    # deferred: pandas costs seconds of start-up
    import pandas as pd

    frame = pd.DataFrame(list(rows), columns=SEED_COLUMNS)
    for column in ("multiple", "mean", "sd", "in_distribution"):
        frame[column] = frame[column].astype(float)
    for column in ("length", "n", "measured", "n_learned"):
        frame[column] = frame[column].astype(int)
    frame.attrs["competence"] = threshold
    return frame
