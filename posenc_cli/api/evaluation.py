"""The evaluation commands as functions: `eval_config` (the perplexity settings, checked together), `evaluate`
(eval-extrapolate), which measures (or reads back) every run's perplexity per length and returns an `Evaluation`;
`evaluate_passkey`, `evaluate_tasks` and `evaluate_algorithmic` (eval-passkey, eval-tasks, eval-algorithmic), each
returning a `TaskEvaluation`; and `task_summaries`, what every registered evaluation task adds after a sweep's or
`compare`'s table."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from posenc_cli.analysis.gather import labelled_in_order
from posenc_cli.bounds import Bound
from posenc_cli.config import EvalConfig, build_dataclass
from posenc_cli.errors import ConfigError, UserError
from posenc_cli.evaluation.results import TOO_FEW_TOKENS, cell_status
from posenc_cli.fsutil import atomic_write_json
from posenc_cli.report.gate import DEFAULT_COMPETENCE

if TYPE_CHECKING:
    import pandas as pd

    from posenc_cli.analysis.rows import RunRecord
    from posenc_cli.evaluation.tasks.base import Summary

__all__ = [
    "Evaluation",
    "TaskEvaluation",
    "check_instance_length",
    "eval_config",
    "evaluate",
    "evaluate_algorithmic",
    "evaluate_passkey",
    "evaluate_tasks",
    "task_summaries",
]

PathLike = str | Path


def eval_config(
    *,
    lengths: Sequence[float] | None = None,
    abs_lengths: Sequence[int] | None = None,
    protocol: str | None = None,
    stride: int | None = None,
    target: int | None = None,
    window: int | None = None,
    sinks: int | None = None,
    tokens: int | None = None,
    batch_tokens: int | None = None,
    dtype: str | None = None,
    force: bool = False,
    longppl: bool = True,
    longppl_evaluator: PathLike | None = None,
) -> EvalConfig:
    """`EvalConfig`'s defaults with the settings given (None: the default), type- and range-checked, and refused
    where they do not go together (a stride without a protocol that has one, and so on). `longppl_evaluator`: the
    run whose key tokens LongPPL scores every run on (none: LongPPL is not measured)."""
    if lengths is not None and abs_lengths is not None:
        raise ConfigError("give either --lengths (multiples of the base length) or --abs-lengths (tokens), not both")
    raw = dataclasses.asdict(EvalConfig())
    given = {
        "lengths": list(lengths) if lengths is not None else None,
        "abs_lengths": list(abs_lengths) if abs_lengths is not None else None,
        "protocol": protocol,
        "stride": stride,
        "target": target,
        "window": window,
        "sinks": sinks,
        "tokens": tokens,
        "batch_tokens": batch_tokens,
        "dtype": dtype,
    }
    raw.update({k: v for k, v in given.items() if v is not None})
    raw["force"], raw["longppl"] = force, longppl
    raw["longppl_evaluator"] = str(longppl_evaluator) if longppl_evaluator is not None else None
    cfg = build_dataclass(EvalConfig, raw, "eval")
    cfg.validate()  # eval.stride needs sliding or streaming: EvalConfig's rule, as a sweep's
    if (window is not None or sinks is not None) and cfg.protocol != "streaming":
        raise ConfigError("--window and --sinks apply to --protocol streaming only")
    if cfg.target is not None and cfg.protocol != "fixed-target":
        raise ConfigError("--target applies to --protocol fixed-target only")
    return cfg


@dataclass(frozen=True)
class Evaluation:
    """eval-extrapolate's results: one doc per run (`perplexity.evaluate_run`'s, with "label" and "path"), labelled
    and ordered as `compare` shows them; `by`: the table's columns, "multiple" or "length" (abs lengths)."""

    results: list[dict[str, Any]]
    config: EvalConfig
    by: Literal["multiple", "length"] = "multiple"

    def to_json(self) -> dict[str, Any]:
        """The combined document of `--json`: every run's doc without its bookkeeping ("reused")."""
        return {"schema_version": 1, "runs": [{k: v for k, v in r.items() if k != "reused"} for r in self.results]}

    def write_json(self, path: PathLike) -> None:
        """Write the combined document (`to_json`) to `path`, atomically."""
        atomic_write_json(Path(path), self.to_json())

    @property
    def reused(self) -> int:
        """Cells read back from the runs' eval/extrapolate.json rather than measured now."""
        return sum(r["reused"] for r in self.results)

    @property
    def cells(self) -> int:
        return sum(len(r["entries"]) for r in self.results)

    @property
    def too_few_tokens(self) -> bool:
        """True when the corpus held no window of some cell's length (the table marks it n/m)."""
        return any(cell_status(e) == TOO_FEW_TOKENS for r in self.results for e in r["entries"])


def evaluate(
    runs: Sequence[PathLike],
    *,
    config: EvalConfig | None = None,
    lengths: Sequence[float] | None = None,
    abs_lengths: Sequence[int] | None = None,
    tokens: int | None = None,
    protocol: str | None = None,
    data_overrides: Sequence[str] = (),
    positions: str | None = None,
    positions_seed: int = 0,
    train_length: int | None = None,
    device: str = "auto",
    threads: int = 0,
    force: bool = False,
    longppl_evaluator: PathLike | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    on_run: Callable[[Path, int, int], None] | None = None,
    on_skip: Callable[[Path, str], None] | None = None,
    **options: Any,
) -> Evaluation:
    """Perplexity of every run below `runs` at each length, stored in each run's eval/extrapolate.json (cells
    already stored are reused unless `force`). The settings are `eval_config`'s (`lengths`, `tokens`, `protocol`,
    and `options`: stride, target, window, sinks, batch_tokens, dtype), or a ready `config`. `data_overrides`
    (`data=text data.paths=[FILE]`) score every run on another corpus; `positions`: random or sequential (default:
    what the run trained with); `train_length`: transformers directories' training length. `progress`, `on_run`
    and `on_skip` report as the work goes (a searched run that cannot be read is skipped through `on_skip`).
    `longppl_evaluator`: a run directory whose key tokens every run's LongPPL is scored on (`evaluation.longppl`;
    overrides `config`'s); without one, LongPPL is not measured."""
    # deferred: torch
    from posenc_cli.evaluation.tasks.extrapolate import evaluate_paths
    from posenc_cli.run.device import resolve_device
    from posenc_cli.run.hf_run import train_length_override

    if not runs:
        raise ConfigError("give at least one run directory (or a sweep directory holding runs)")
    given = {"lengths": lengths, "abs_lengths": abs_lengths, "tokens": tokens, "protocol": protocol, **options}
    if config is None:
        config = eval_config(**given, force=force)
    elif any(v is not None for v in given.values()) or force:
        raise ConfigError("give evaluation settings or a config, not both")
    if longppl_evaluator is not None:
        config = dataclasses.replace(config, longppl_evaluator=str(longppl_evaluator))
        config.validate()
    if positions is not None and positions not in ("random", "sequential"):
        raise ConfigError(f"--positions must be random or sequential, got {positions!r}")
    run_device = resolve_device(device, "--device")  # an unavailable device is reported as the flag given
    if train_length is not None and train_length < 2:
        raise ConfigError(f"--train-length must be >= 2, got {train_length}")
    with train_length_override(train_length):
        results = evaluate_paths(
            [str(p) for p in runs],
            config,
            data_overrides=list(data_overrides),
            device=run_device,
            threads=threads,
            progress=progress,
            on_run=on_run,
            on_skip=on_skip,
            positions=positions,
            positions_seed=positions_seed,
        )
    by: Literal["multiple", "length"] = "length" if config.abs_lengths is not None else "multiple"
    return Evaluation(labelled_in_order(results), config, by)  # the labels and order compare shows


# ----------------------------------------------------------------------------------------------------------------
# eval-passkey, eval-tasks, eval-algorithmic: the task evaluations, and what a sweep or compare adds after its table


@dataclass(frozen=True)
class TaskEvaluation:
    """eval-passkey's, eval-tasks' or eval-algorithmic's results: one doc per run (in the order found; its entries,
    "path" and "reused"), each run's competence gates (`evaluation.competence`: task -> gate for passkey ("passkey")
    and algorithmic tasks, (task, scoring) -> gate for the retrieval tasks), the tasks asked (retrieval; the ones
    measured otherwise), the competence threshold, eval-tasks' effective-length `threshold`, and eval-algorithmic's
    per-run task summaries (`evaluation.algorithmic.summarize`: accuracy per length, the ≤L and beyond-L means)."""

    results: list[dict[str, Any]]
    gates: list[dict[Any, Any]]
    tasks: list[str]
    competence: float
    threshold: float | None = None
    summaries: list[list[Any]] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The combined document of `--json`: every run's doc without its bookkeeping ("reused")."""
        return {"schema_version": 1, "runs": [{k: v for k, v in r.items() if k != "reused"} for r in self.results]}

    def write_json(self, path: PathLike) -> None:
        """Write the combined document (`to_json`) to `path`, atomically."""
        atomic_write_json(Path(path), self.to_json())

    @property
    def reused(self) -> int:
        """Cells read back from the runs' results files rather than measured now."""
        return sum(r["reused"] for r in self.results)

    @property
    def cells(self) -> int:
        return sum(len(r["entries"]) for r in self.results)

    def frame(self) -> pd.DataFrame:
        """One row per cell: run, task, scoring ("" but for retrieval), length, depth (None where the task has
        none), status, score (RULER's score, or the exact-match accuracy), and the run's competence on the task."""
        # deferred: pandas costs seconds of start-up
        import pandas as pd

        rows = []
        for r, gates in zip(self.results, self.gates, strict=True):
            for e in r["entries"]:
                task = str(e.get("task", "passkey"))
                scoring = str(e.get("scoring", "exact")) if "score" in e else ""
                gate = gates.get((task, scoring)) or gates.get(task)
                rows.append(
                    {
                        "run": r["run"],
                        "task": task,
                        "scoring": scoring,
                        "length": int(e["length"]),
                        "depth": e.get("depth"),
                        "status": e.get("status"),
                        "score": e.get("score", e.get("accuracy")),
                        "competence": None if gate is None else gate.status,
                    }
                )
        columns = ["run", "task", "scoring", "length", "depth", "status", "score", "competence"]
        frame = pd.DataFrame(rows, columns=columns)
        frame.attrs["competence"] = self.competence
        return frame


def _check_runs(runs: Sequence[PathLike], lengths: Any = None, abs_lengths: Any = None) -> list[str]:
    if not runs:
        raise ConfigError("give at least one run directory (or a sweep directory holding runs)")
    if lengths is not None and abs_lengths is not None:
        raise ConfigError("give either --lengths (multiples of the base length) or --abs-lengths (tokens), not both")
    return [str(p) for p in runs]


def _set_grid(cfg: Any, **values: Sequence[float] | None) -> None:
    for name, given in values.items():
        if given is not None:
            setattr(cfg, name, list(given))


def evaluate_passkey(
    runs: Sequence[PathLike],
    *,
    lengths: Sequence[float] | None = None,
    abs_lengths: Sequence[int] | None = None,
    depths: Sequence[float] | None = None,
    trials: int = 10,
    digits: int | None = None,
    seed: int = 0,
    batch_tokens: int = 16384,
    dtype: str = "auto",
    device: str = "auto",
    threads: int = 0,
    force: bool = False,
    competence: float = DEFAULT_COMPETENCE,
    progress: Callable[[str, int, int], None] | None = None,
    on_run: Callable[[Path, int, int], None] | None = None,
) -> TaskEvaluation:
    """Passkey retrieval of every run below `runs` (`evaluation.tasks.passkey`): exact match of a key hidden at each
    depth of prompts of each length (`lengths`: multiples of the base length, default 1,2,4,8; or `abs_lengths`),
    stored in each run's eval/passkey.json (cells already there reused unless `force`). A grid no memory can hold for
    these runs is refused before anything is measured. Each run's gate ("passkey") at `competence`."""
    # deferred: torch
    from posenc_cli.evaluation.competence import check_threshold
    from posenc_cli.evaluation.grid import check_grid_fits
    from posenc_cli.evaluation.passkey import PasskeyConfig
    from posenc_cli.evaluation.tasks.passkey import PasskeyTask, evaluate_passkey_paths, passkey_gates
    from posenc_cli.run.device import resolve_device

    paths = _check_runs(runs, lengths, abs_lengths)
    check_threshold(competence)
    if dtype not in ("auto", "fp32", "bf16"):
        raise ConfigError(f"--dtype must be auto, fp32 or bf16, got {dtype!r}")
    cfg = PasskeyConfig(trials=trials, digits=digits, seed=seed, batch_tokens=batch_tokens, dtype=dtype, force=force)
    _set_grid(cfg, lengths=lengths, abs_lengths=abs_lengths, depths=depths)
    check_grid_fits(cfg, paths)
    cfg.validate()
    run_device = resolve_device(device, "--device")
    results = evaluate_passkey_paths(paths, cfg, device=run_device, threads=threads, progress=progress, on_run=on_run)
    return TaskEvaluation(results, passkey_gates(results, competence), [PasskeyTask.name], competence)


def evaluate_tasks(
    runs: Sequence[PathLike],
    *,
    tasks: Sequence[str] | None = None,
    lengths: Sequence[float] | None = None,
    abs_lengths: Sequence[int] | None = None,
    depths: Sequence[float] | None = None,
    trials: int = 10,
    digits: int | None = None,
    sizes: dict[str, int] | None = None,
    scoring: str = "contains",
    tokens_to_generate: int | None = None,
    seed: int = 0,
    haystack: str = "filler",
    batch_tokens: int = 16384,
    dtype: str = "auto",
    device: str = "auto",
    threads: int = 0,
    force: bool = False,
    threshold: float | None = None,
    competence: float = DEFAULT_COMPETENCE,
    progress: Callable[[str, int, int], None] | None = None,
    on_run: Callable[[Path, int, int], None] | None = None,
) -> TaskEvaluation:
    """The RULER-style retrieval tasks (`evaluation.tasks.retrieval`; `tasks` None: all of them) of every run below
    `runs` per length × depth, stored in each run's eval/tasks.json (cells already there reused unless `force`).
    `scoring` "contains" is RULER's (`tokens_to_generate` tokens, default the run's or RULER's budget), "exact"
    posenc's; `sizes` override the episodes' (`ruler.base.Sizes`), `haystack` "corpus" reads the run's own text.
    Each run's gates ((task, scoring)) at `competence`; `threshold` (None: RULER's 0.856) is the effective length's."""
    # deferred: torch
    from posenc_cli.data.ruler import registry
    from posenc_cli.evaluation.competence import check_threshold
    from posenc_cli.evaluation.tasks.retrieval import (
        TasksEvalConfig,
        evaluate_tasks_paths,
        registry_task,
        retrieval_gates,
    )
    from posenc_cli.report.effective_length import RULER_THRESHOLD
    from posenc_cli.run.device import resolve_device

    paths = _check_runs(runs, lengths, abs_lengths)
    names = list(tasks) if tasks is not None else list(registry())
    for name in names:
        registry_task(name)
    threshold = RULER_THRESHOLD if threshold is None else threshold
    cfg = TasksEvalConfig(
        trials=trials,
        digits=digits,
        sizes=sizes,
        scoring=scoring,
        tokens_to_generate=tokens_to_generate,
        seed=seed,
        haystack=haystack,
        batch_tokens=batch_tokens,
        dtype=dtype,
        force=force,
        threshold=threshold,
    )
    _set_grid(cfg, lengths=lengths, abs_lengths=abs_lengths, depths=depths)
    cfg.validate()
    check_threshold(competence)
    run_device = resolve_device(device, "--device")
    results = evaluate_tasks_paths(
        paths, names, cfg, device=run_device, threads=threads, progress=progress, on_run=on_run
    )
    return TaskEvaluation(results, retrieval_gates(results, competence), names, competence, threshold)


def evaluate_algorithmic(
    runs: Sequence[PathLike],
    *,
    tasks: Sequence[str] | None = None,
    lengths: Sequence[int] | None = None,
    max_length: int | None = None,
    examples: int | None = None,
    seed: int = 0,
    batch_tokens: int = 16384,
    dtype: str = "auto",
    device: str = "auto",
    threads: int = 0,
    force: bool = False,
    competence: float = DEFAULT_COMPETENCE,
    progress: Callable[[str, int, int], None] | None = None,
    on_run: Callable[[Path, int, int], None] | None = None,
) -> TaskEvaluation:
    """The algorithmic tasks (`evaluation.tasks.algorithmic`) of every run below `runs`, exact match per task ×
    instance length, stored in each run's eval/algorithmic.json (cells already there reused unless `force`). None
    means the run's `data=algorithmic` settings (its tasks, L = data.max_length, lengths 1..2L, data.eval_examples),
    and for a run trained on other data every task, L = 20, 1..2L and 100 examples. Each run's gates (task) at
    `competence`."""
    # deferred: torch
    from posenc_cli.data.algorithmic import task_class
    from posenc_cli.evaluation.algorithmic import AlgorithmicEvalConfig, summarize
    from posenc_cli.evaluation.competence import check_threshold
    from posenc_cli.evaluation.tasks.algorithmic import evaluate_algorithmic_paths, gates_of
    from posenc_cli.run.device import resolve_device

    paths = _check_runs(runs)
    for name in tasks or ():
        task_class(name, "task")
    cfg = AlgorithmicEvalConfig(
        tasks=list(tasks) if tasks is not None else None,
        lengths=list(lengths) if lengths is not None else None,
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
    results = evaluate_algorithmic_paths(
        paths, cfg, device=run_device, threads=threads, progress=progress, on_run=on_run
    )
    measured = list(dict.fromkeys(str(e["task"]) for r in results for e in r["entries"]))
    summaries = [summarize(r["entries"]) for r in results]
    return TaskEvaluation(results, gates_of(results, competence), measured, competence, summaries=summaries)


def check_instance_length(length: int, name: str) -> None:
    """A one-line `ConfigError` naming `name` unless `length` is an instance length eval-algorithmic measures: in
    [1, 2·MAX_LENGTH], twice the longest trainable L (`AlgorithmicEvalConfig.validate`'s bound)."""
    # deferred: the task generators
    from posenc_cli.data.algorithmic.base import MAX_LENGTH

    Bound(1, 2 * MAX_LENGTH, integer=True).check(length, name)


def task_summaries(
    runs: Sequence[PathLike] | Sequence[RunRecord],
    *,
    threshold: float | None = None,
    competence: float = DEFAULT_COMPETENCE,
) -> list[Summary]:
    """What every registered evaluation task adds after a comparison of these runs (`EvalTask.summarise`): for each
    task with stored cells, the result docs, the competence gates and the tables `posenc sweep` and `posenc compare`
    print after theirs. `runs`: run or sweep directories (a named run with no stored task cell at all is refused: it
    was never evaluated), or the records of a comparison (`Comparison.records`: nothing is refused)."""
    # deferred: the task registry imports torch
    from posenc_cli.analysis.gather import gather
    from posenc_cli.analysis.task_results import task_summaries as summaries_of

    if runs and all(isinstance(r, (str, Path)) for r in runs):
        records = gather([Path(p) for p in runs])  # type: ignore[arg-type]
        summaries = summaries_of(records, threshold, competence)
        shown = {str(Path(r["path"]).resolve()) for s in summaries for r in s.results}
        unevaluated = [r.run_dir for r in records if str(Path(r.run_dir).resolve()) not in shown]
        if unevaluated:
            raise UserError(
                f"{unevaluated[0]} has no stored task cells (run posenc eval-tasks, eval-passkey or eval-algorithmic "
                "on it first)"
            )
        return summaries
    return summaries_of(list(runs), threshold, competence)  # type: ignore[arg-type]
