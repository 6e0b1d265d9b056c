"""RULER-style retrieval tasks (`niah-single`, ..., `variable-tracking`; `posenc eval-tasks`, `posenc_cli.data.ruler`).

One evaluation task is registered per retrieval task of `posenc_cli.data.ruler`, so a new file there is evaluated
with no
edit here. For each length × depth, `trials` seeded episodes become prompts of exactly that many tokens (prompt +
the longest answer of the cell; `ruler.base.build_prompts`), the answer is decoded greedily (batched; one forward
per generated token) and scored as RULER does: the share of expected answers present in the output (exact match for
one answer). All tasks share `eval/tasks.json`, cells keyed by task, settings and checkpoint (`loop.measure`).
"""

from __future__ import annotations

import datetime as _dt
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from posenc_cli import __version__
from posenc_cli.config import EvalConfig
from posenc_cli.data.cache import cache_root
from posenc_cli.data.ruler import RetrievalTask
from posenc_cli.data.ruler import registry as ruler_registry
from posenc_cli.data.ruler.base import DEFAULT_DIGITS, GENERATOR_VERSION, PromptTooShort, build_prompts
from posenc_cli.data.sources import open_source
from posenc_cli.data.sources.tasks import TasksDataConfig, corpus_text
from posenc_cli.errors import ConfigError, LengthBeyondScheme
from posenc_cli.evaluation.loop import Entry, measure, results_header
from posenc_cli.evaluation.passkey import check_readable, decode_prompts, validate_grid
from posenc_cli.evaluation.perplexity import (
    check_not_training,
    evaluate_each_run,
    find_runs,
    plan_lengths,
    resolve_dtype,
)
from posenc_cli.evaluation.results import checkpoint_identity, checkpoint_key
from posenc_cli.evaluation.tasks import register
from posenc_cli.evaluation.tasks.base import EvalTask, Progress

if TYPE_CHECKING:
    from posenc_cli.config import Config
    from posenc_cli.run.checkpoint import LoadedRun

RESULTS_FILE = Path("eval") / "tasks.json"
COMMAND = "eval-tasks"
SAMPLES_PER_CELL = 3


@dataclass(kw_only=True)
class TasksEvalConfig:
    """Options of `posenc eval-tasks` (flags mirror these fields); digits None = the run's data.digits (4)."""

    lengths: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0])
    abs_lengths: list[int] | None = None
    depths: list[float] = field(default_factory=lambda: [0.0, 0.5, 1.0])
    trials: int = 10
    digits: int | None = None
    seed: int = 0
    haystack: str = "filler"
    batch_tokens: int = 16384
    dtype: str = "auto"
    force: bool = False

    def validate(self) -> None:
        validate_grid(self)
        if self.haystack not in ("filler", "corpus"):
            raise ConfigError(f"--haystack must be filler or corpus, got {self.haystack!r}")
        if self.dtype not in ("auto", "fp32", "bf16"):
            raise ConfigError(f"--dtype must be auto, fp32 or bf16, got {self.dtype!r}")


@dataclass(frozen=True, kw_only=True)
class TaskEntry(Entry):
    """One task × length × depth cell of `eval/tasks.json`; the fields in the order of the stored keys."""

    task: str
    length: int
    multiple: float
    depth: float
    trials: int
    digits: int
    seed: int
    haystack: str
    generator: int = GENERATOR_VERSION  # the prompts' text version (posenc_cli.data.ruler.base)
    dtype: str
    checkpoint: dict[str, Any]
    status: str = "n/a"
    reason: str | None = None
    score: float | None = None
    exact: float | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    posenc_version: str = __version__
    created: str


def entry_key(e: dict[str, Any]) -> tuple[Any, ...]:
    """What a cell measured: its settings, the prompts' generator version (cells from before it was recorded were
    version 1) and the checkpoint."""
    cell = (e["task"], e["length"], e["depth"], e["trials"], e["digits"], e["seed"], e["haystack"], e["dtype"])
    return (*cell, e.get("generator", 1), *checkpoint_key(e))


def cell_rng(task: str, seed: int, length: int, depth: float) -> np.random.Generator:
    """Episodes of one cell depend only on these, not on which other cells are measured."""
    return np.random.default_rng([seed, zlib.crc32(task.encode()), length, round(depth * 1_000_000)])


def evaluate_task_model(
    model: torch.nn.Module,
    tokenizer: Any,
    task: type[RetrievalTask],
    *,
    length: int,
    depths: Sequence[float],
    trials: int,
    digits: int = DEFAULT_DIGITS,
    seed: int = 0,
    haystack: np.ndarray | None = None,
    batch_tokens: int = 16384,
    dtype: str = "fp32",
    device: str | torch.device = "cpu",
    progress: Progress = None,
) -> list[dict[str, Any]]:
    """RULER scores at one total `length`, one dict per depth: {score (mean share of answers found), exact (share
    of episodes with every answer), samples}. Raises `LengthBeyondScheme` before any forward when the model cannot
    read the prompt, `PromptTooShort` when no haystack fits."""
    check_readable(model, length)
    episodes = []
    for depth in depths:
        rng = cell_rng(task.name, seed, length, depth)
        episodes += [task.sample(rng, float(depth), digits) for _ in range(trials)]
    batch = build_prompts(tokenizer, episodes, length, haystack)
    generated = decode_prompts(
        model,
        batch.prompts,
        batch.answers.shape[1],
        length,
        batch_tokens,
        dtype,
        device,
        progress,
        f"{task.name} L={length}",
    )
    outputs = [tokenizer.decode(generated[r, : batch.answer_len[r]]) for r in range(len(episodes))]
    scores = np.array([task.score(o, ep.answers) for o, ep in zip(outputs, episodes, strict=True)])  # (N,)
    cells = []
    for j, depth in enumerate(depths):
        rows = range(j * trials, (j + 1) * trials)
        samples = [{"answers": list(episodes[r].answers), "output": outputs[r]} for r in rows[:SAMPLES_PER_CELL]]
        cells.append(
            {
                "depth": float(depth),
                "score": round(float(scores[rows.start : rows.stop].mean()), 6),
                "exact": round(float((scores[rows.start : rows.stop] == 1.0).mean()), 6),
                "samples": samples,
            }
        )
    return cells


def corpus_haystack(run: LoadedRun, n_chars: int) -> tuple[np.ndarray, str]:
    """(token ids, label) of real text for haystacks: the start of the validation split of the run's corpus (for
    a `data=tasks` run, its `data.corpus` source)."""
    data = run.config.data
    if isinstance(data, TasksDataConfig):
        data = data.corpus_config()
    source = open_source(data, cache_root(data), None)
    _, val, _ = source.documents()
    text = corpus_text(val, n_chars)
    if not text:
        raise ConfigError(f"the {data.source} corpus has no validation text for --haystack corpus")
    return np.asarray(run.tokenizer.encode(text), dtype=np.int64), f"corpus {data.source}@{source.fingerprint}"


def evaluate_tasks_run(
    run: LoadedRun,
    names: Sequence[str],
    cfg: TasksEvalConfig,
    *,
    device: str | torch.device | None = None,
    force: bool | None = None,
    progress: Progress = None,
) -> dict[str, Any]:
    """Measure (or reuse) every task × length × depth cell of `cfg` for a loaded run, stored in eval/tasks.json.

    Returns the results doc's header plus "path", "reused", "not_saved" and this call's entries (task-major, then
    length, then depth)."""
    cfg.validate()
    tasks = [registry_task(name) for name in names]
    check_not_training(run.path)
    force = cfg.force if force is None else force
    device = torch.device(device) if device is not None else next(run.model.parameters()).device
    digits = cfg.digits if cfg.digits is not None else getattr(run.config.data, "digits", DEFAULT_DIGITS)
    dtype = resolve_dtype(cfg.dtype, run.meta.precision, device)
    checkpoint = checkpoint_identity(run.meta)
    train_length, base_length = run.meta.lengths(run.config)
    planned = plan_lengths(EvalConfig(lengths=list(cfg.lengths), abs_lengths=cfg.abs_lengths), base_length)
    hay_ids, hay_label = None, "filler"
    if cfg.haystack == "corpus":
        hay_ids, hay_label = corpus_haystack(run, 8 * max(n for n, _ in planned))
    header = results_header(run.path.name, str(run.config.pos.name), train_length, base_length)
    entries: list[dict[str, Any]] = []
    reused, not_saved = 0, None
    for task in tasks:

        def plan(task: type[RetrievalTask] = task) -> Iterator[list[TaskEntry]]:
            for length, multiple in planned:
                now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
                yield [
                    TaskEntry(
                        task=task.name,
                        length=length,
                        multiple=multiple,
                        depth=float(d),
                        trials=cfg.trials,
                        digits=digits,
                        seed=cfg.seed,
                        haystack=hay_label,
                        dtype=dtype,
                        checkpoint=dict(checkpoint),
                        created=now,
                    )
                    for d in cfg.depths
                ]

        def measure_length(cells: Sequence[TaskEntry], task: type[RetrievalTask] = task) -> list[TaskEntry]:
            try:
                measured = evaluate_task_model(
                    run.model,
                    run.tokenizer,
                    task,
                    length=cells[0].length,
                    depths=cfg.depths,
                    trials=cfg.trials,
                    digits=digits,
                    seed=cfg.seed,
                    haystack=hay_ids,
                    batch_tokens=cfg.batch_tokens,
                    dtype=dtype,
                    device=device,
                    progress=progress,
                )
            except LengthBeyondScheme as e:  # the same reason text as eval-extrapolate
                return [replace(c, reason=e.reason) for c in cells]
            except PromptTooShort as e:
                return [replace(c, reason=str(e)) for c in cells]
            keys = ("score", "exact", "samples")
            return [replace(c, status="ok", **{k: m[k] for k in keys}) for c, m in zip(cells, measured, strict=True)]

        done = measure(
            run.path / RESULTS_FILE, COMMAND, header, checkpoint, plan(), measure_length, key=entry_key, force=force
        )
        entries += done.entries
        reused += done.reused
        not_saved = not_saved or done.not_saved
    return {**header, "path": str(run.path), "reused": reused, "not_saved": not_saved, "entries": entries}


def evaluate_tasks_paths(
    paths: Sequence[Path | str],
    names: Sequence[str],
    cfg: TasksEvalConfig,
    *,
    device: str | torch.device = "auto",
    threads: int = 0,
    progress: Progress = None,
    on_run: Callable[[Path, int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Find the runs below `paths` and evaluate each in turn (one model in memory at a time)."""
    cfg.validate()
    for name in names:
        registry_task(name)

    def evaluate(run: LoadedRun, run_device: torch.device) -> dict[str, Any]:
        return evaluate_tasks_run(run, names, cfg, device=run_device, progress=progress)

    return evaluate_each_run(find_runs(paths), evaluate, device=device, threads=threads, on_run=on_run)


def combined_json(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """All runs' results in one JSON-safe document (for --json)."""
    return {"schema_version": 1, "runs": [{k: v for k, v in r.items() if k != "reused"} for r in results]}


def registry_task(name: str) -> type[RetrievalTask]:
    tasks = ruler_registry()
    if name not in tasks:
        raise ConfigError(f"unknown task '{name}' for eval-tasks (available: {', '.join(tasks)})")
    return tasks[name]


class RetrievalEvalTask(EvalTask):
    """A sweep job's evaluation of one retrieval task (subclassed per `posenc_cli.data.ruler` task below)."""

    command = COMMAND
    results_file = RESULTS_FILE
    retrieval: ClassVar[type[RetrievalTask]]

    @classmethod
    def evaluate_job(cls, run: LoadedRun, cfg: Config, *, device: torch.device, progress: Progress = None) -> Any:
        """eval-tasks' defaults at the job's `eval.lengths`; a `data=tasks` job measures only the tasks it trained."""
        if isinstance(cfg.data, TasksDataConfig) and cls.name not in cfg.data.tasks:
            return {"path": str(run.path), "reused": 0, "entries": []}
        return evaluate_tasks_run(run, [cls.name], TasksEvalConfig(lengths=cfg.eval.lengths), device=device)


for _task in ruler_registry().values():
    register(type(f"{_task.__name__}EvalTask", (RetrievalEvalTask,), {"name": _task.name, "retrieval": _task}))
