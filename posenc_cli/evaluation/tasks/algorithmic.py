"""`algorithmic`: exact match per algorithmic task × instance length (`posenc eval-algorithmic`; examples, decoding
and the split means in `posenc_cli.evaluation.algorithmic`), for sweep jobs trained on `data=algorithmic`.

Its cells' `length` is an instance length (items, digits, terms: 1..2L), not a token count (`length_axis`). Each cell
is a group of its own; cells are keyed by task, length, examples, seed, generator version, precision, what a cell
records (`MEASURES`), the training lengths, the position ids fed and the checkpoint. A sweep and `compare` show one
table per run (one run) or the in-distribution / beyond-L means of every run (several), with the competence gate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from posenc_cli import __version__
from posenc_cli.data.algorithmic import task_class
from posenc_cli.data.algorithmic.base import GENERATOR_VERSION
from posenc_cli.data.sources.algorithmic import AlgorithmicDataConfig
from posenc_cli.errors import LengthBeyondScheme
from posenc_cli.evaluation.algorithmic import (
    ALGORITHMIC_FILE,
    COMMAND,
    MEASURES,
    AlgorithmicEvalConfig,
    cell_examples,
    evaluate_cell,
    plan_for,
    summarize,
)
from posenc_cli.evaluation.competence import ALGORITHMIC, check_threshold, result_competence
from posenc_cli.evaluation.loop import Entry, evaluate
from posenc_cli.evaluation.perplexity.planning import resolve_dtype
from posenc_cli.evaluation.positions import BeyondRange, Positions, trained_positions
from posenc_cli.evaluation.results import checkpoint_key, positions_key
from posenc_cli.evaluation.runs import evaluate_each_run, find_runs
from posenc_cli.evaluation.tasks import register
from posenc_cli.evaluation.tasks.base import EvalTask, Progress, Summary
from posenc_cli.report.algorithmic_report import run_tables, summary_table
from posenc_cli.report.gate import DEFAULT_COMPETENCE

if TYPE_CHECKING:
    from posenc_cli.config import Config
    from posenc_cli.run.load import LoadedRun

__all__ = [
    "AlgorithmicEntry",
    "AlgorithmicEvalTask",
    "entry_key",
    "evaluate_algorithmic_paths",
    "evaluate_algorithmic_run",
    "gates_of",
]


def entry_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    """Two entries measure the same cell when these agree (the checkpoint too: see `results.checkpoint_key`)."""
    cell = (entry["task"], entry["length"], entry["examples"], entry["seed"], entry["generator"], entry["dtype"])
    cell = (*cell, entry.get("measures", 1))  # cells stored before token_accuracy existed are measured again
    lengths = (entry.get("train_min_length", 1), entry["train_max_length"])  # addition's examples follow the first
    return (*cell, *lengths, *positions_key(entry), *checkpoint_key(entry))


@dataclass(frozen=True, kw_only=True)
class AlgorithmicEntry(Entry):
    """One task × instance-length cell of `eval/algorithmic.json`; the fields in the order of the stored keys."""

    task: str
    length: int
    train_max_length: int  # L
    train_min_length: int  # the least training length: train_min_length..L are in distribution
    in_distribution: bool
    examples: int
    seed: int
    generator: int
    dtype: str
    measures: int = MEASURES  # what a cell records (in the key): 2 added token_accuracy
    positions: dict[str, Any] = field(default_factory=lambda: Positions().to_json())  # the ids fed (in the key)
    checkpoint: dict[str, Any] = field(default_factory=dict)
    status: str = "n/a"
    reason: str | None = None
    tokens: int | None = None
    correct: int | None = None
    accuracy: float | None = None
    token_accuracy: float | None = None
    samples: list[dict[str, str]] = field(default_factory=list)
    posenc_version: str = __version__
    created: str = ""


@register
class AlgorithmicEvalTask(EvalTask):
    """eval-algorithmic on one loaded run with `cfg` (its None fields filled from the run's data: `plan_for`)."""

    name = "algorithmic"
    command = COMMAND
    results_file = ALGORITHMIC_FILE
    length_axis: ClassVar[str] = "instance"  # cells are per instance length, not per token length
    summary_rank = 2

    def __init__(
        self,
        run: LoadedRun,
        cfg: AlgorithmicEvalConfig,
        *,
        device: str | torch.device | None = None,
        progress: Progress = None,
    ) -> None:
        cfg.validate()
        super().__init__(run, device=device, progress=progress)
        self.cfg = cfg
        self.dtype = resolve_dtype(cfg.dtype, run.meta.precision, self.device)
        self.asked = plan_for(cfg, run.config.data)
        self.positions = trained_positions(run.config)  # Ruoss et al. evaluate randomized positions with fresh draws

    @classmethod
    def for_job(
        cls, run: LoadedRun, cfg: Config, *, device: torch.device, progress: Progress = None
    ) -> AlgorithmicEvalTask | None:
        """The job's `data=algorithmic` settings (its tasks, 1..data.eval_max_length or 2L, data.eval_examples); a
        job trained on other data has no algorithmic cells."""
        if not isinstance(cfg.data, AlgorithmicDataConfig):
            return None
        return cls(run, AlgorithmicEvalConfig(), device=device, progress=progress)

    def plan(self) -> Iterator[list[AlgorithmicEntry]]:
        asked = self.asked
        for task in asked.tasks:
            for n in (n for n in asked.lengths if n >= task_class(task).min_length):  # flip-flop: from 2
                yield [
                    AlgorithmicEntry(
                        task=task,
                        length=n,
                        train_max_length=asked.max_length,
                        train_min_length=asked.least[task],
                        in_distribution=asked.least[task] <= n <= asked.max_length,
                        examples=asked.examples,
                        seed=self.cfg.seed,
                        generator=GENERATOR_VERSION,
                        dtype=self.dtype,
                        positions=self.positions.to_json(),
                    )
                ]

    key = staticmethod(entry_key)

    def measure(self, group: Sequence[AlgorithmicEntry]) -> list[AlgorithmicEntry]:
        (cell,) = group
        examples = cell_examples(cell.task, cell.length, cell.examples, cell.seed, cell.train_min_length)
        try:
            measured = evaluate_cell(
                self.run.model,
                self.run.tokenizer,
                examples,
                batch_tokens=self.cfg.batch_tokens,
                dtype=self.dtype,
                device=self.device,
                progress=self.progress,
                label=f"{cell.task} n={cell.length}",
                positions=self.positions,
            )
        except LengthBeyondScheme as e:  # the same reason text as eval-extrapolate
            return [cell.not_measured(e.reason)]
        except BeyondRange as e:
            return [cell.not_measured(str(e))]
        return [cell.measured(**measured)]

    @classmethod
    def cell(cls, entry: dict[str, Any]) -> tuple[Any, ...]:
        return str(entry["task"]), int(entry["length"])

    @classmethod
    def current(cls, entry: dict[str, Any]) -> bool:
        return entry.get("generator", 1) == GENERATOR_VERSION  # cells of an older generator asked other questions

    @classmethod
    def summarise(
        cls, results: Sequence[dict[str, Any]], *, threshold: float | None = None, competence: float | None = None
    ) -> Summary | None:
        """In-distribution / beyond-L accuracy per run and task with the competence gate: one run's own table, or
        every run's means side by side."""
        competence = DEFAULT_COMPETENCE if competence is None else competence
        check_threshold(competence)
        gates = gates_of(results, competence)
        summaries = [summarize(r["entries"]) for r in results]
        if len(results) > 1:
            table = summary_table(results, summaries, gates, competence)
        else:
            table = (run_tables(results, summaries, gates, competence) or [None])[0]
        if table is None:
            return None
        return Summary(cls.name, list(results), gates, [table])


def gates_of(results: Sequence[dict[str, Any]], competence: float = DEFAULT_COMPETENCE) -> list[dict[str, Any]]:
    """Task -> the competence gate (`evaluation.competence`) of each run's result doc, tasks in first-seen order."""
    out = []
    for r in results:
        tasks = dict.fromkeys(str(e["task"]) for e in r["entries"])
        out.append({t: result_competence(r, t, ALGORITHMIC, competence) for t in tasks})
    return out


def evaluate_algorithmic_run(
    run: LoadedRun,
    cfg: AlgorithmicEvalConfig,
    *,
    device: str | torch.device | None = None,
    force: bool | None = None,
    progress: Progress = None,
) -> dict[str, Any]:
    """Measure (or reuse) every task × length cell `cfg` asks of a loaded run; store them in eval/algorithmic.json.

    Returns the results doc restricted to this call's entries (task-major, length-minor) plus "path", "reused" and
    "not_saved". A run being trained right now is refused.
    """
    task = AlgorithmicEvalTask(run, cfg, device=device, progress=progress)
    return evaluate(task, force=cfg.force if force is None else force)


def evaluate_algorithmic_paths(
    paths: Sequence[Path | str],
    cfg: AlgorithmicEvalConfig,
    *,
    device: str | torch.device = "auto",
    threads: int = 0,
    force: bool | None = None,
    progress: Progress = None,
    on_run: Callable[[Path, int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Find the runs below `paths` and evaluate each in turn (one model in memory at a time)."""
    cfg.validate()

    def one(run: LoadedRun, run_device: torch.device) -> dict[str, Any]:
        return evaluate_algorithmic_run(run, cfg, device=run_device, force=force, progress=progress)

    return evaluate_each_run(find_runs(paths), one, device=device, threads=threads, on_run=on_run)
