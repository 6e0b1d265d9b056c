"""The task cells runs already stored (RULER-style retrieval, passkey, algorithmic), gathered for a sweep's or
`compare`'s records, with the competence gate of each run × task (`evaluation.competence`).

`stored_task_results` / `stored_passkey_results` / `stored_algorithmic_results` read each record's results file
(cells of the run's current checkpoint and of the current prompt generator, the latest per cell) as result docs
with the record's label, its "path" and training length (`stored_results`: those of any registered evaluation task,
`task_summaries`: what each task's `summarise` makes of them, printed after a sweep's or `compare`'s table);
`task_rows` flattens them into one row per run × task × scoring × length (the mean over depths) with the run's
in-distribution accuracy and gate state beside every row, for results.csv; `task_frame` is one row per run × task ×
scoring, for the API. The numbers of a flagged run stay: only its `competence` column says "not learned", "not
trained on this task" or "longer than its training examples".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc_cli.analysis.gather import current_checkpoint
from posenc_cli.analysis.rows import distinct_tails
from posenc_cli.evaluation.competence import (
    check_threshold,
    result_competence,
)
from posenc_cli.evaluation.results import TASKS_COMMAND, TASKS_FILE, checkpoint_key, read_results_file
from posenc_cli.evaluation.tasks import registry
from posenc_cli.evaluation.tasks.base import EvalTask, Summary
from posenc_cli.report.gate import DEFAULT_COMPETENCE, gate_note, gate_text

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "TASK_FIELDS",
    "passkey_gates",
    "scoring_of",
    "stored_algorithmic_results",
    "stored_passkey_results",
    "stored_results",
    "stored_task_results",
    "task_frame",
    "task_markdown",
    "task_rows",
    "task_summaries",
    "task_units",
]

# The columns results.csv gives a task row (besides the run's label, stage, job, scheme...).
TASK_FIELDS = ("task", "scoring", "length", "multiple", "score", "in_distribution", "competence")


def scoring_of(entry: dict[str, Any]) -> str:
    """A stored retrieval cell's scoring (cells from before it was recorded were "exact")."""
    return str(entry.get("scoring", "exact"))


def _stored(
    records: Sequence[Any],
    path: Path,
    command: str,
    generator: int | None,
    key: Any,
    keep: Callable[[dict[str, Any]], bool] | None = None,
    docs: dict[Path, dict[str, Any] | None] | None = None,
) -> list[dict[str, Any]]:
    """Result docs of `path` (inside each run) for the records that have it: the latest cell per `key(entry)` among
    those of the run's current checkpoint (and of `generator`, when given, and that `keep`). Failed jobs are left
    out. `docs` caches the files read (several tasks share one)."""
    results = []
    docs = {} if docs is None else docs
    labels = row_labels(records)
    for record in records:
        if record.status == "failed":
            continue
        file = Path(record.run_dir) / path
        if file not in docs:
            docs[file] = read_results_file(file, command)
        doc = docs[file]
        if doc is None:
            continue
        current = current_checkpoint(Path(record.run_dir))
        ours = [
            e
            for e in doc["entries"]
            if checkpoint_key(e) == current
            and (generator is None or e.get("generator", 1) == generator)
            and (keep is None or keep(e))
        ]
        cells = {key(e): e for e in ours}
        if cells:
            results.append(
                {
                    "run": labels[id(record)],
                    "scheme": record.scheme or str(doc.get("scheme", "")),
                    "path": str(record.run_dir),
                    "train_length": doc.get("train_length"),
                    "base_length": doc.get("base_length"),
                    "entries": list(cells.values()),
                }
            )
    return results


def row_label(record: Any, shared: bool) -> str:
    """A run's label in a task table, where each run is its own row: the seeds of one experiment share a label (a
    perplexity table averages them), so a shared label names the run's seed (`rope · seed 1`)."""
    return f"{record.label} · seed {record.seed}" if shared and record.seed is not None else record.label


def row_labels(records: Sequence[Any]) -> dict[int, str]:
    """id(record) -> its row label in a task table (`row_label`; failed records left out). Runs that still share a
    label (one seed's run at the chosen steps and at twice them, a sweep's `seeds` and `long` stages) are told apart
    by their stage where the stages differ, else by the shortest ends of their directories."""
    shown = [r for r in records if r.status != "failed"]
    shared = Counter(r.label for r in shown)
    labels = {id(r): row_label(r, shared[r.label] > 1) for r in shown}
    clashing: dict[str, list[Any]] = {}
    for r in shown:
        clashing.setdefault(labels[id(r)], []).append(r)
    for label, group in clashing.items():
        if len(group) < 2:
            continue
        stages = [str(r.stage) for r in group]
        unique = all(stages) and len(set(stages)) == len(stages)
        names = stages if unique else _first_difference([Path(r.run_dir) for r in group])
        labels.update((id(r), f"{label} · {name}") for r, name in zip(group, names, strict=True))
    return labels


def _first_difference(paths: Sequence[Path]) -> list[str]:
    """The first directory name in which the paths differ, where it tells each apart ('seeds' and 'long' for
    <sweep>/seeds/... and <sweep>/long/...); else the shortest ends that do (`rows.distinct_tails`)."""
    parts = [p.resolve().parts for p in paths]
    for names in zip(*parts, strict=False):
        if len(set(names)) > 1:
            return list(names) if len(set(names)) == len(names) else distinct_tails(list(paths))
    return distinct_tails(list(paths))


def stored_results(
    records: Sequence[Any], task: type[EvalTask], docs: dict[Path, dict[str, Any] | None] | None = None
) -> list[dict[str, Any]]:
    """The cells of a registered evaluation task the records' runs stored: per run, the latest entry per
    `task.cell` among those of the run's current checkpoint that `task.current` keeps, as a result doc (see
    `_stored`)."""
    return _stored(records, task.results_file, task.command, None, task.cell, keep=task.current, docs=docs)


def task_summaries(
    records: Sequence[Any], threshold: float | None = None, competence: float = DEFAULT_COMPETENCE
) -> list[Summary]:
    """What every registered evaluation task adds after a comparison of the records' runs (`EvalTask.summarise` of
    its stored cells), in `summary_rank` then name order; tasks without cells, or without a summary, add nothing."""
    check_threshold(competence)
    docs: dict[Path, dict[str, Any] | None] = {}
    summaries = []
    for task in sorted(registry().values(), key=lambda t: (t.summary_rank, t.name)):
        if getattr(task.summarise, "__func__", None) is EvalTask.summarise.__func__:
            continue  # the comparison table itself (eval-extrapolate), or a task without a summary
        results = stored_results(records, task, docs)
        summary = task.summarise(results, threshold=threshold, competence=competence) if results else None
        if summary is not None:
            summaries.append(summary)
    return summaries


def stored_task_results(records: Sequence[Any]) -> list[dict[str, Any]]:
    """eval-tasks cells (eval/tasks.json) of the records' runs: the latest per task × scoring × length × depth."""
    # deferred: the retrieval evaluation imports torch
    from posenc_cli.data.ruler.base import GENERATOR_VERSION

    def key(e: dict[str, Any]) -> tuple[Any, ...]:
        return e["task"], scoring_of(e), int(e["length"]), None if e.get("depth") is None else float(e["depth"])

    return _stored(records, TASKS_FILE, TASKS_COMMAND, GENERATOR_VERSION, key)


def stored_passkey_results(records: Sequence[Any]) -> list[dict[str, Any]]:
    """eval-passkey cells (eval/passkey.json) of the records' runs: the latest per length × depth."""
    # deferred: the passkey evaluation imports torch
    from posenc_cli.evaluation.passkey import PASSKEY_FILE

    return _stored(records, PASSKEY_FILE, "eval-passkey", None, lambda e: (int(e["length"]), float(e["depth"])))


def stored_algorithmic_results(records: Sequence[Any]) -> list[dict[str, Any]]:
    """eval-algorithmic cells (eval/algorithmic.json) of the records' runs, of the current generator."""
    # deferred: the algorithmic evaluation imports torch
    from posenc_cli.data.algorithmic.base import GENERATOR_VERSION
    from posenc_cli.evaluation.algorithmic import ALGORITHMIC_FILE, COMMAND

    return _stored(records, ALGORITHMIC_FILE, COMMAND, GENERATOR_VERSION, lambda e: (e["task"], int(e["length"])))


def passkey_gates(
    results: Sequence[dict[str, Any]], threshold: float = DEFAULT_COMPETENCE
) -> list[tuple[str, float | None]]:
    """(competence state, in-distribution accuracy) of each eval-passkey result doc, for `report.passkey_report`."""
    check_threshold(threshold)
    gates = [result_competence(r, "passkey", "passkey", threshold) for r in results]
    return [(g.status, g.accuracy) for g in gates]


def _length_rows(result: dict[str, Any], task: str, family: str, scoring: str | None) -> list[dict[str, Any]]:
    """(length, multiple, mean score over depths; None when a depth is n/a) of one run × task × scoring."""
    metric = "score" if family == "retrieval" else "accuracy"
    mine = [
        e
        for e in result["entries"]
        if (family == "passkey" or e["task"] == task) and (scoring is None or scoring_of(e) == scoring)
    ]
    by_length: dict[int, list[dict[str, Any]]] = {}
    for e in mine:
        by_length.setdefault(int(e["length"]), []).append(e)
    rows = []
    for length, cells in sorted(by_length.items()):
        values = [float(e[metric]) for e in cells if e.get("status") == "ok" and e.get(metric) is not None]
        score = sum(values) / len(values) if values and len(values) == len(cells) else None
        multiple = cells[0].get("multiple")
        rows.append({"length": length, "multiple": None if multiple is None else float(multiple), "score": score})
    return rows


def task_units(records: Sequence[Any]) -> list[tuple[dict[str, Any], str, str, str | None]]:
    """(result doc, task, family, scoring) for every run × task × scoring the records' runs stored."""
    units: list[tuple[dict[str, Any], str, str, str | None]] = []
    for r in stored_task_results(records):
        pairs = dict.fromkeys((str(e["task"]), scoring_of(e)) for e in r["entries"])
        units += [(r, task, "retrieval", scoring) for task, scoring in pairs]
    units += [(r, "passkey", "passkey", None) for r in stored_passkey_results(records)]
    for r in stored_algorithmic_results(records):
        units += [(r, task, "algorithmic", None) for task in dict.fromkeys(str(e["task"]) for e in r["entries"])]
    return units


def task_rows(records: Sequence[Any], threshold: float = DEFAULT_COMPETENCE) -> list[dict[str, Any]]:
    """One row per run × task × scoring × length of the records' stored task cells: label, run_dir, scheme, task,
    scoring ("contains"/"exact" for retrieval, "" otherwise), length, multiple (None for algorithmic instance
    lengths), score (exact match or RULER's score, the mean over depths), and the run's in_distribution accuracy and
    competence state on that task (`report.gate`)."""
    check_threshold(threshold)
    rows = []
    for result, task, family, scoring in task_units(records):
        gate = result_competence(result, task, family, threshold, scoring)
        for cell in _length_rows(result, task, family, scoring):
            rows.append(
                {
                    "label": result["run"],
                    "run_dir": result["path"],
                    "scheme": result["scheme"],
                    "task": task,
                    "scoring": scoring or "",
                    **cell,
                    "multiple": cell["multiple"] if family != "algorithmic" else None,
                    "in_distribution": gate.accuracy,
                    "competence": gate.status,
                }
            )
    return rows


def task_frame(records: Sequence[Any], threshold: float = DEFAULT_COMPETENCE) -> pd.DataFrame:
    """One row per run × task × scoring: columns run, task, scoring, in_distribution (the gate's accuracy, NaN when
    none), competence (the gate's state: learned, not learned, not trained on this task, cannot measure, not
    measured), learned (bool), beyond (the mean score beyond the training length: L+1..2L for algorithmic tasks,
    lengths above the training length otherwise; NaN when none measured). `attrs["competence"]`: the threshold."""
    # deferred: pandas costs seconds of start-up
    import pandas as pd

    check_threshold(threshold)
    rows = []
    for result, task, family, scoring in task_units(records):
        gate = result_competence(result, task, family, threshold, scoring)
        cells = _length_rows(result, task, family, scoring)
        if family == "algorithmic":
            limit = max(int(e["train_max_length"]) for e in result["entries"] if e["task"] == task)
            beyond = [c["score"] for c in cells if limit < c["length"] <= 2 * limit and c["score"] is not None]
        else:
            top = result.get("train_length")
            beyond = [
                c["score"]
                for c in cells
                if c["score"] is not None
                and (c["length"] > top if top is not None else (c["multiple"] or 0.0) > 1.0 + 1e-9)
            ]
        rows.append(
            {
                "run": result["run"],
                "task": task,
                "scoring": scoring or "",
                "in_distribution": float("nan") if gate.accuracy is None else gate.accuracy,
                "competence": gate.status,
                "learned": gate.learned,
                "beyond": sum(beyond) / len(beyond) if beyond else float("nan"),
            }
        )
    columns = ["run", "task", "scoring", "in_distribution", "competence", "learned", "beyond"]
    frame = pd.DataFrame(rows, columns=columns)
    frame.attrs["competence"] = threshold
    return frame


def task_markdown(records: Sequence[Any], threshold: float = DEFAULT_COMPETENCE) -> str:
    """The runs' stored task cells as a markdown table (one row per run × task × scoring: the in-distribution score
    with the gate's mark, and the mean beyond the training length), then the gate's caption; "" without task cells."""
    frame = task_frame(records, threshold)
    if frame.empty:
        return ""
    lines = ["| run | task | ≤L | beyond L |", "|---|---|---|---|"]
    for row in frame.itertuples():
        accuracy = None if math.isnan(row.in_distribution) else float(row.in_distribution)
        beyond = "n/a" if math.isnan(row.beyond) else f"{row.beyond:.0%}"
        task = f"{row.task} ({row.scoring})" if row.scoring else str(row.task)
        lines.append(f"| {row.run} | {task} | {gate_text(str(row.competence), accuracy)} | {beyond} |")
    return "\n".join(lines) + f"\n\n{gate_note(threshold)}\n"
