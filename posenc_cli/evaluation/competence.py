"""In-distribution accuracy of a run on a task, and the competence gate built on it (issue #38, item 2).

A beyond-L score means something only for a model that learned the task at the lengths it was trained on: a run
that finds the needle 10% of the time at 1× "does not extrapolate" only in the sense that it never learned. So every
task table prints, beside the beyond-L cells, the run's accuracy in distribution, and flags a run below a threshold
(`report.gate.DEFAULT_COMPETENCE`, 0.9) as "not learned"; a run whose training data never held the task is "not
trained on this task" instead (that label takes precedence). In distribution means:

- algorithmic tasks (`eval/algorithmic.json`): the measure the task's reference reports (`reference_metric`: exact
  match; for MQAR and flip-flop the share of scored pieces right, Zoology's per-query and flip-flop's per-read
  accuracy) averaged over the instance lengths the run trained on, the least training length (a cell's
  `train_min_length`, else `data.min_length`, else 1) to `data.max_length` = L, each length weighed as the
  reference's split weighs it (`AlgorithmicTask.length_weight`: 1 but for addition), as eval-algorithmic's ≤L column
  (`evaluation.algorithmic.split_mean`, exact match);
- RULER-style retrieval tasks (`eval/tasks.json`) and passkey (`eval/passkey.json`): the mean score (RULER's, or the
  exact-match accuracy) over the cells (length × depth) at lengths ≤ the training length, i.e. multiples ≤ 1×.
  "tasks", all RULER-style tasks together: the mean of the run's tasks' scores, learned only when each is. A run
  trained one example per row (`train.packing` none or document) read no prompt longer than its longest training
  prompt (meta.json's `data.longest_prompt`: the tokens before an example's first answer token; else its
  `data.longest_example`; in a mixture, the task's own, `data.longest_prompt_by_task`, where the token cache could
  tell each example's task), which may be shorter than the row: a cell whose prompt (its length less the generation
  budget) is longer is not in distribution, and a run with no other ≤L cell is "longer than its training examples"
  (its 1× is already a length it never saw: failing there is a failure to extrapolate, not proof that it did not
  learn).

n/a cells (the scheme cannot read the length) are left out of the mean; with none measured the state is "cannot
measure" (every in-distribution cell n/a) or "not measured" (none stored). The gate compares with `>=`.

The pure functions take stored entries and the run's data config; `assess_run(run_dir, task)` and `competence(run_dir,
task)` read a run directory (its config and the task's results file, cells of its current checkpoint only), for the
commands and for a sweep's selection stage, which picks each scheme's setting by `competence`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc_cli.data.algorithmic import registry as algorithmic_registry
from posenc_cli.data.algorithmic.base import GENERATOR_VERSION as ALGORITHMIC_GENERATOR
from posenc_cli.data.ruler import registry as ruler_registry
from posenc_cli.data.ruler.base import GENERATOR_VERSION as RULER_GENERATOR
from posenc_cli.data.sources.algorithmic import AlgorithmicDataConfig
from posenc_cli.data.sources.passkey import PasskeyDataConfig
from posenc_cli.data.sources.tasks import TasksDataConfig
from posenc_cli.errors import CheckpointError, ConfigError, UserError
from posenc_cli.evaluation.results import (
    TASKS_COMMAND,
    TASKS_FILE,
    checkpoint_identity,
    checkpoint_key,
    read_results_file,
)
from posenc_cli.report.gate import (
    BEYOND_TRAINING,
    CANNOT_MEASURE,
    DEFAULT_COMPETENCE,
    LEARNED,
    NOT_LEARNED,
    NOT_MEASURED,
    NOT_TRAINED,
    GateStatus,
    gate_text,
)
from posenc_cli.run.load import read_config
from posenc_cli.run.meta import is_hf_dir, read_meta, read_run_meta

__all__ = [
    "ALGORITHMIC",
    "DEFAULT_COMPETENCE",
    "NO_TASKS",
    "PASSKEY",
    "RETRIEVAL",
    "Competence",
    "PromptBound",
    "algorithmic_competence",
    "assess_run",
    "check_threshold",
    "competence",
    "gate_status",
    "in_distribution",
    "prompt_tokens",
    "result_competence",
    "result_data_config",
    "retrieval_competence",
    "retrieval_mean_competence",
    "run_data_config",
    "run_longest_prompt",
    "run_prompt_bound",
    "task_family",
    "trained_on",
]

ALGORITHMIC = "algorithmic"  # the evaluation task of all algorithmic tasks: the mean over the run's tasks
RETRIEVAL = "tasks"  # the evaluation task of all RULER-style tasks: the mean over the run's tasks (`data=tasks`)
PASSKEY = "passkey"
NO_TASKS = object()  # the "data config" of a transformers directory: it trained on none of posenc's tasks


@dataclass(frozen=True)
class Competence:
    """A run's in-distribution accuracy on one task and the gate's verdict (`status`, see `report.gate`); `lengths`:
    the (lowest, highest) length counted as in distribution, None where nothing was."""

    task: str
    status: GateStatus
    accuracy: float | None
    threshold: float
    lengths: tuple[int, int] | None = None

    @property
    def learned(self) -> bool:
        return self.status == LEARNED

    @property
    def text(self) -> str:
        """'97%', '43% ✗ not learned', '⊘ not trained on this task', ... (`report.gate.gate_text`)."""
        return gate_text(self.status, self.accuracy)


@dataclass(frozen=True)
class PromptBound:
    """How long a prompt a run trained on one example per row read: `longest` over all its examples, `by_task` each
    task's of a mixture whose examples told their task (meta.json `data.longest_prompt_by_task`); a task not in it
    is bounded by `longest`."""

    longest: int | None
    by_task: dict[str, int] = field(default_factory=dict)

    def of(self, task: str) -> int | None:
        return self.by_task.get(task, self.longest)


def _bound(longest_prompt: int | PromptBound | None, task: str) -> int | None:
    return longest_prompt.of(task) if isinstance(longest_prompt, PromptBound) else longest_prompt


def check_threshold(threshold: float, flag: str = "--competence") -> None:
    """ConfigError unless `threshold` is an accuracy in [0, 1]."""
    if not 0.0 <= threshold <= 1.0:
        raise ConfigError(f"{flag} must be an accuracy in [0, 1], got {threshold}")


def gate_status(accuracy: float | None, *, trained: bool, cells: int, threshold: float) -> GateStatus:
    """The gate's verdict: not trained (first), not measured (no in-distribution cell), cannot measure (cells, all
    n/a), else learned when `accuracy >= threshold`."""
    if not trained:
        return NOT_TRAINED
    if accuracy is None:
        return CANNOT_MEASURE if cells else NOT_MEASURED
    return LEARNED if accuracy >= threshold else NOT_LEARNED


def in_distribution(
    entries: Iterable[dict[str, Any]], low: float, high: float, metric: str
) -> tuple[float | None, int]:
    """(mean `metric` over the measured cells with `low <= length <= high`, number of such cells, n/a included);
    the mean is None when none was measured."""
    inside = [e for e in entries if low <= int(e["length"]) <= high]
    values = [float(e[metric]) for e in inside if e.get("status") == "ok" and e.get(metric) is not None]
    return (sum(values) / len(values) if values else None), len(inside)


def trained_on(data: Any, task: str) -> bool:
    """Whether a run whose data config is `data` trained on `task` (an algorithmic task or "algorithmic", a RULER-style
    task, "passkey"). `data` None (a config that cannot be read) counts as trained: the accuracy decides."""
    if data is None:
        return True
    if isinstance(data, AlgorithmicDataConfig):
        return task == ALGORITHMIC or task in data.tasks
    if isinstance(data, TasksDataConfig):
        return task == RETRIEVAL or task in data.tasks
    if isinstance(data, PasskeyDataConfig):
        return task == PASSKEY
    return False


def algorithmic_competence(
    entries: Sequence[dict[str, Any]], task: str, data: Any, threshold: float = DEFAULT_COMPETENCE
) -> Competence:
    """`task`'s reference measure (`AlgorithmicTask.reference_metric`: exact match, or per-token accuracy for the
    tasks scored at many positions) averaged over the training lengths min_length..L (`data.min_length` of a
    `data=algorithmic` run, else 1; L the cells' `train_max_length`); the latest cell per length counts. `task`
    "algorithmic": the mean over the tasks the entries hold (each task weighs the same), learned only when every
    task is."""
    if task == ALGORITHMIC:
        tasks = list(dict.fromkeys(str(e["task"]) for e in entries))
        parts = [algorithmic_competence(entries, t, data, threshold) for t in tasks]
        measured = [p.accuracy for p in parts if p.accuracy is not None]
        accuracy = sum(measured) / len(measured) if measured else None
        status = gate_status(accuracy, trained=trained_on(data, task), cells=len(parts), threshold=threshold)
        if status == LEARNED and any(not p.learned for p in parts):
            status = NOT_LEARNED
        spans = [p.lengths for p in parts if p.lengths is not None]
        lengths = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None
        return Competence(task, status, accuracy, threshold, lengths)
    latest = {int(e["length"]): e for e in entries if str(e["task"]) == task}
    if not latest:
        status = gate_status(None, trained=trained_on(data, task), cells=0, threshold=threshold)
        return Competence(task, status, None, threshold)
    high = max(int(e["train_max_length"]) for e in latest.values())
    low = min(_least_length(e, data) for e in latest.values())
    cls = algorithmic_registry().get(task)
    inside = {n: e for n, e in latest.items() if low <= n <= high}
    weights = {n: cls.length_weight(n, low) if cls is not None else 1 for n in inside}
    metric = cls.reference_metric if cls is not None else "accuracy"
    measured = [(weights[n], float(e[metric])) for n, e in inside.items() if _ok(e, metric)]
    total = sum(w for w, _ in measured)
    accuracy, cells = (sum(w * a for w, a in measured) / total if total else None), len(inside)
    status = gate_status(accuracy, trained=trained_on(data, task), cells=cells, threshold=threshold)
    return Competence(task, status, accuracy, threshold, (low, high))


def _ok(entry: dict[str, Any], metric: str) -> bool:
    return entry.get("status") == "ok" and entry.get(metric) is not None


def _least_length(entry: dict[str, Any], data: Any) -> int:
    """The least training length of a cell's task: the cell's `train_min_length` where it records one, else the
    run's `data.min_length` (a `data=algorithmic` run that sets it), else 1."""
    if entry.get("train_min_length") is not None:
        return int(entry["train_min_length"])
    if isinstance(data, AlgorithmicDataConfig) and isinstance(data.min_length, int):
        return min(data.min_length, int(entry["train_max_length"]))
    return 1


def prompt_tokens(entry: dict[str, Any]) -> int:
    """The prompt of a retrieval or passkey cell: its length less the tokens generated after it (RULER's budget
    under "contains" scoring; none stored: the whole length)."""
    return int(entry["length"]) - int(entry.get("generate") or 0)


def retrieval_competence(
    entries: Sequence[dict[str, Any]],
    task: str,
    data: Any,
    train_length: int | None,
    threshold: float = DEFAULT_COMPETENCE,
    metric: str = "score",
    longest_prompt: int | PromptBound | None = None,
) -> Competence:
    """A RULER-style task's (`metric` "score") or passkey's ("accuracy") mean over the cells at lengths <=
    `train_length` (None: the cells at multiples <= 1×), every depth. Pass the cells of one scoring. With
    `longest_prompt` (the run's longest training prompt in tokens, or its `PromptBound`: `run_prompt_bound`, the
    task's own where the run recorded one), a cell whose prompt is longer is left out; when that leaves none, the
    status is `BEYOND_TRAINING` and the accuracy the mean of the cells left out."""
    mine = [e for e in entries if str(e.get("task", PASSKEY)) == task]
    bound = _bound(longest_prompt, task)
    if train_length is None:
        inside = [e for e in mine if float(e["multiple"]) <= 1.0 + 1e-9]
        high = max((int(e["length"]) for e in inside), default=0)
    else:
        inside, high = [e for e in mine if int(e["length"]) <= train_length], int(train_length)
    seen = [e for e in inside if bound is None or prompt_tokens(e) <= bound]
    beyond = bool(inside) and not seen
    if not beyond and len(seen) < len(inside):  # the cells left in distribution end at a shorter length
        inside, high = seen, max(int(e["length"]) for e in seen)
    accuracy, cells = in_distribution(inside, 0, high, metric)
    status = gate_status(accuracy, trained=trained_on(data, task), cells=cells, threshold=threshold)
    if beyond and status != NOT_TRAINED:
        status = BEYOND_TRAINING
    low = min((int(e["length"]) for e in inside), default=None)
    return Competence(task, status, accuracy, threshold, None if low is None else (low, high))


def retrieval_mean_competence(
    entries: Sequence[dict[str, Any]],
    data: Any,
    train_length: int | None,
    threshold: float = DEFAULT_COMPETENCE,
    longest_prompt: int | PromptBound | None = None,
) -> Competence:
    """The RULER-style tasks' gate taken together (`task` "tasks"): the mean of each task's in-distribution score
    (`retrieval_competence`, each task weighs the same) over the tasks the run trained on (`data.tasks` of a
    `data=tasks` run, else the tasks the entries hold); learned only when every one of them is. What a sweep over
    the RULER-style mixture selects each scheme's setting by."""
    tasks = list(data.tasks) if isinstance(data, TasksDataConfig) else []
    tasks = tasks or list(dict.fromkeys(str(e["task"]) for e in entries))
    parts = [
        retrieval_competence(entries, t, data, train_length, threshold, longest_prompt=longest_prompt) for t in tasks
    ]
    measured = [p.accuracy for p in parts if p.accuracy is not None]
    accuracy = sum(measured) / len(measured) if len(measured) == len(parts) and parts else None
    cells = 0 if any(p.status == NOT_MEASURED for p in parts) else len(parts)  # one task unmeasured: no mean
    status = gate_status(accuracy, trained=trained_on(data, RETRIEVAL), cells=cells, threshold=threshold)
    if status == LEARNED and any(not p.learned for p in parts):
        status = NOT_LEARNED
    if status != NOT_TRAINED and any(p.status == BEYOND_TRAINING for p in parts):
        status = BEYOND_TRAINING
    spans = [p.lengths for p in parts if p.lengths is not None]
    lengths = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None
    return Competence(RETRIEVAL, status, accuracy, threshold, lengths)


def task_family(task: str) -> str:
    """Which results file holds `task`: "algorithmic" (a task of `data.algorithmic` or "algorithmic"), "passkey" or
    "retrieval" (a task of `data.ruler` or "tasks", their mean); ConfigError for any other name."""
    if task == ALGORITHMIC or task in algorithmic_registry():
        return ALGORITHMIC
    if task == PASSKEY:
        return PASSKEY
    if task == RETRIEVAL or task in ruler_registry():
        return "retrieval"
    known = [ALGORITHMIC, *algorithmic_registry(), PASSKEY, RETRIEVAL, *ruler_registry()]
    raise ConfigError(f"unknown task {task!r} for the competence gate (known: {', '.join(known)})")


def run_data_config(run_dir: Path | str) -> Any:
    """The data config a run trained on: `NO_TASKS` for a transformers directory (trained on none of posenc's
    tasks), None when its config cannot be read (`trained_on` then lets the accuracy decide)."""
    run_dir = Path(run_dir)
    if is_hf_dir(run_dir):
        return NO_TASKS
    try:
        return read_config(run_dir, read_meta(run_dir)).data
    except UserError:
        return None


def run_longest_prompt(run_dir: Path | str) -> int | None:
    """The longest prompt (tokens) of the examples the run trained on one per row (meta.json's
    `data.longest_prompt`, else its `data.longest_example`: data without answers); None for a run trained on windows
    of its token stream (every length to its row), a transformers directory, a run recorded before the keys, or meta
    that cannot be read."""
    bound = run_prompt_bound(run_dir)
    return None if bound is None else bound.longest


def run_prompt_bound(run_dir: Path | str) -> PromptBound | None:
    """The run's `PromptBound`: `run_longest_prompt` and, for a mixture whose examples told their task, each task's
    longest prompt (meta.json `data.longest_prompt_by_task`, recorded by the token cache); None where
    `run_longest_prompt` is (the whole bound unknown)."""
    run_dir = Path(run_dir)
    if is_hf_dir(run_dir):
        return None
    try:
        data = read_run_meta(run_dir).record.get("data")
    except UserError:
        return None
    if not isinstance(data, dict):
        return None
    value = data.get("longest_prompt")
    value = value if isinstance(value, int) else data.get("longest_example")
    if not isinstance(value, int):
        return None
    by_task = data.get("longest_prompt_by_task")
    by_task = by_task if isinstance(by_task, dict) else {}
    return PromptBound(int(value), {str(k): int(v) for k, v in by_task.items() if isinstance(v, int)})


def _current_cells(run_dir: Path, doc: dict[str, Any], generator: int | None) -> list[dict[str, Any]]:
    """The stored cells of the run's current checkpoint (all of a transformers directory's) and of `generator`."""
    entries = list(doc.get("entries") or [])
    if not is_hf_dir(run_dir):
        current = checkpoint_key({"checkpoint": checkpoint_identity(read_run_meta(run_dir))})
        entries = [e for e in entries if checkpoint_key(e) == current]
    if generator is not None:
        entries = [e for e in entries if e.get("generator", 1) == generator]
    return entries


def assess_run(
    run_dir: Path | str, task: str, threshold: float = DEFAULT_COMPETENCE, scoring: str = "contains"
) -> Competence:
    """The gate of `task` for the run in `run_dir`, from its stored cells (nothing is measured): `task` an algorithmic
    task or "algorithmic" (the mean over the run's tasks), "passkey", a RULER-style task or "tasks" (the mean over the
    run's RULER-style tasks; their `scoring` cells: "contains", RULER's, or "exact"). "not measured" when the
    results file holds no cell of it."""
    # deferred: these modules import torch; the gate of a stored file needs neither
    from posenc_cli.evaluation.algorithmic import ALGORITHMIC_FILE
    from posenc_cli.evaluation.algorithmic import COMMAND as ALGORITHMIC_COMMAND
    from posenc_cli.evaluation.passkey import PASSKEY_FILE

    check_threshold(threshold)
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: no such run directory")
    family = task_family(task)
    data = run_data_config(run_dir)
    if family == ALGORITHMIC:
        doc = read_results_file(run_dir / ALGORITHMIC_FILE, ALGORITHMIC_COMMAND)
        entries = _current_cells(run_dir, doc, ALGORITHMIC_GENERATOR) if doc else []
        return algorithmic_competence(entries, task, data, threshold)
    if family == PASSKEY:
        doc = read_results_file(run_dir / PASSKEY_FILE, "eval-passkey")
        entries = _current_cells(run_dir, doc, None) if doc else []
        train_length = doc.get("train_length") if doc else None
        longest = run_prompt_bound(run_dir)
        return retrieval_competence(entries, PASSKEY, data, train_length, threshold, "accuracy", longest)
    doc = read_results_file(run_dir / TASKS_FILE, TASKS_COMMAND)
    entries = _current_cells(run_dir, doc, RULER_GENERATOR) if doc else []
    entries = [e for e in entries if str(e.get("scoring", "exact")) == scoring]
    latest = {(e["task"], int(e["length"]), e.get("depth")): e for e in entries}  # the file's order: last wins
    train_length = doc.get("train_length") if doc else None
    longest = run_prompt_bound(run_dir)
    if task == RETRIEVAL:
        return retrieval_mean_competence(list(latest.values()), data, train_length, threshold, longest)
    return retrieval_competence(list(latest.values()), task, data, train_length, threshold, longest_prompt=longest)


def competence(run_dir: Path | str, task: str, scoring: str = "contains") -> float | None:
    """A run's in-distribution accuracy on `task` from its stored cells (see `assess_run`): None when none was
    measured. What a sweep's selection stage ranks settings by; the gate's threshold plays no part in it."""
    return assess_run(run_dir, task, DEFAULT_COMPETENCE, scoring).accuracy


def result_data_config(result: dict[str, Any]) -> Any:
    """The data config of the run behind an evaluation result doc (its "path"); None without one (the accuracy
    decides)."""
    path = result.get("path") or result.get("run_dir")
    return run_data_config(path) if path else None


def result_competence(
    result: dict[str, Any], task: str, family: str, threshold: float = DEFAULT_COMPETENCE, scoring: str | None = None
) -> Competence:
    """The gate of one result doc's `task`: `family` "algorithmic", "passkey" or "retrieval" (its `scoring` cells,
    all of them when None; a cell stored before its scoring was recorded was "exact")."""
    data = result_data_config(result)
    entries = result["entries"]
    if family == ALGORITHMIC:
        return algorithmic_competence(entries, task, data, threshold)
    path = result.get("path") or result.get("run_dir")
    longest = run_prompt_bound(path) if path else None
    if family == PASSKEY:
        return retrieval_competence(entries, PASSKEY, data, result.get("train_length"), threshold, "accuracy", longest)
    mine = [e for e in entries if scoring is None or str(e.get("scoring", "exact")) == scoring]
    return retrieval_competence(mine, task, data, result.get("train_length"), threshold, longest_prompt=longest)
