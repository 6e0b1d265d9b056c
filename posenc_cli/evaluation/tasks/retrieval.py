"""RULER-style retrieval tasks (`niah-single`, ..., `variable-tracking`; `posenc eval-tasks`, `posenc_cli.data.ruler`).

One evaluation task is registered per retrieval task of `posenc_cli.data.ruler`, so a new file there is evaluated
with no edit here. For each length × depth, `trials` seeded episodes become prompts, a greedy continuation is
decoded (batched; `passkey.decode_prompts`) and scored.

Scoring (`--scoring`): "contains" (default) is RULER's (NVIDIA/RULER c3f5e3b): `tokens_to_generate` tokens are
generated (RULER's 128 for NIAH, 30 for VT, `scripts/data/synthetic/constants.py`; stopped at the end-of-document
token) and scored by `string_match_all` (`scripts/eval/synthetic/constants.py:28`), the share of expected answers
contained case-insensitively in the output. As in RULER (`scripts/data/synthetic/niah.py:245`), the prompt and the
generated tokens together fill the length under test: the prompt has `length - tokens_to_generate` tokens, so the
last generated token sits at position `length - 1`; a length that cannot hold the needles, question and budget is
n/a with the reason. "exact" is posenc's stricter score: only as many tokens as the longest answer are generated
(the prompt fills `length` minus that) and one answer must match exactly.

The tasks whose context is the episode (`ruler.base.ContextTask`: common-words, frequent-words, kv-retrieval) get
the most words or pairs that fit the prompt (`ruler.base.fill_episodes`); a length that cannot hold their smallest
episode is n/a with what it needs, never a smaller episode. Tasks without a depth (`has_depth` False: RULER's CWE and
FWE) have one cell per length, depth None, whatever `--depths` says.

RULER's effective length (`report.effective_length`) is computed from the stored cells when they are shown;
`TasksEvalConfig.threshold` only checks eval-tasks' `--threshold`.

All tasks share `eval/tasks.json`, cells keyed by task, settings (sizes, scoring and generation budget included)
and checkpoint (the shared loop, `loop.measure`). A sweep and `compare` show each task's mean over depths per run ×
length, with the competence gate and the effective length (`RetrievalEvalTask.summarise`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from posenc_cli import __version__
from posenc_cli.config import EvalConfig
from posenc_cli.data.cache import cache_root
from posenc_cli.data.ruler import RetrievalTask
from posenc_cli.data.ruler import registry as ruler_registry
from posenc_cli.data.ruler.base import (
    GENERATOR_VERSION,
    RULER_SIZES,
    SCORINGS,
    BudgetTooShort,
    ContextTask,
    Episode,
    PromptTooShort,
    Sizes,
    build_prompts,
    fill_episodes,
    until_end,
)
from posenc_cli.data.sources import open_source
from posenc_cli.data.sources.tasks import TasksDataConfig, corpus_text
from posenc_cli.errors import ConfigError, LengthBeyondScheme
from posenc_cli.evaluation.competence import check_threshold, result_competence
from posenc_cli.evaluation.loop import Entry, measure
from posenc_cli.evaluation.passkey import check_readable, decode_prompts, validate_grid
from posenc_cli.evaluation.perplexity.planning import plan_lengths, resolve_dtype
from posenc_cli.evaluation.positions import Positions, trained_positions
from posenc_cli.evaluation.results import TASKS_COMMAND, TASKS_FILE, checkpoint_key, positions_key
from posenc_cli.evaluation.runs import evaluate_each_run, find_runs
from posenc_cli.evaluation.tasks import register
from posenc_cli.evaluation.tasks.base import EvalTask, Progress, Summary
from posenc_cli.report.effective_length import RULER_THRESHOLD
from posenc_cli.report.gate import DEFAULT_COMPETENCE
from posenc_cli.report.retrieval_report import scoring_of, task_summary_tables
from posenc_cli.run.memory import available_memory

if TYPE_CHECKING:
    from posenc_cli.config import Config
    from posenc_cli.run.load import LoadedRun

COMMAND = TASKS_COMMAND
SAMPLES_PER_CELL = 3
MAX_GENERATE = 1 << 16  # --tokens-to-generate at most
# Host bytes one episode needs besides its token rows: the Episode (about 1.3 KiB at RULER's sizes, tracemalloc)
# and its encoded pieces in build_prompts (about 3 KiB with the byte tokenizer).
EPISODE_BYTES = 4096


@dataclass(kw_only=True)
class TasksEvalConfig:
    """Options of `posenc eval-tasks` (flags mirror these fields). Episode sizes: a run trained on `data=tasks` gets
    its mixture's (`data.keys`, ..., `data.letters`), any other run RULER's (`ruler.base.Sizes`); `sizes` and
    `digits` override them. `tokens_to_generate` None: the run's `data.tokens_to_generate`, else RULER's budget per
    task (128 NIAH, 30 VT); only "contains" scoring generates a budget ("exact" generates the answer's tokens)."""

    lengths: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0])
    abs_lengths: list[int] | None = None
    depths: list[float] = field(default_factory=lambda: [0.0, 0.5, 1.0])
    trials: int = 10
    digits: int | None = None
    sizes: dict[str, int] | None = None
    scoring: str = "contains"
    tokens_to_generate: int | None = None
    seed: int = 0
    haystack: str = "filler"
    batch_tokens: int = 16384
    dtype: str = "auto"
    force: bool = False
    threshold: float = RULER_THRESHOLD  # effective length's (a report setting: not in the cells)

    def validate(self) -> None:
        validate_grid(self)
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"--threshold must be a score in [0, 1], got {self.threshold}")
        if not 0 <= self.seed < 1 << 63:
            raise ConfigError(f"--seed must be in [0, 2^63), got {self.seed}")
        if self.scoring not in SCORINGS:
            raise ConfigError(f"--scoring must be {' or '.join(SCORINGS)}, got {self.scoring!r}")
        if self.tokens_to_generate is not None and not 1 <= self.tokens_to_generate <= MAX_GENERATE:
            raise ConfigError(f"--tokens-to-generate must be in [1, {MAX_GENERATE}], got {self.tokens_to_generate}")
        known = {f.name for f in fields(Sizes)}
        for name in self.sizes or {}:
            if name not in known:
                raise ConfigError(f"--sizes: unknown size {name!r} (known: {', '.join(sorted(known))})")
        replace(RULER_SIZES, **(self.sizes or {})).validate("--sizes ")
        rows = self.trials * len(self.depths)  # episodes of one task × length, held at once
        check_memory(rows, 2, 1, "--trials")  # a lower bound, before any run is loaded
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
    depth: float | None  # None: a task without depth (`RetrievalTask.has_depth`)
    trials: int
    sizes: dict[str, int]  # the sizes this task uses (`ruler.base.Sizes`, `RetrievalTask.size_names`)
    seed: int
    haystack: str
    scoring: str  # "contains" (RULER's string_match_all) or "exact"
    generate: int | None  # tokens generated per episode ("contains"); None: the answer's tokens ("exact")
    generator: int = GENERATOR_VERSION  # the prompts' text version (posenc_cli.data.ruler.base)
    dtype: str
    positions: dict[str, Any] = field(default_factory=lambda: Positions().to_json())  # the ids fed (in the key)
    checkpoint: dict[str, Any] = field(default_factory=dict)  # stamped by the loop, as `created`
    status: str = "n/a"
    reason: str | None = None
    score: float | None = None
    exact: float | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    posenc_version: str = __version__
    created: str = ""


def entry_key(e: dict[str, Any]) -> tuple[Any, ...]:
    """What a cell measured: its settings, its scoring and generation budget (cells from before they were recorded
    were scored "exact" on the answer's tokens), the prompts' generator version (1 before it was recorded) and the
    checkpoint."""
    sizes = e.get("sizes") if isinstance(e.get("sizes"), dict) else {"digits": e.get("digits")}
    cell = (e["task"], e["length"], e["depth"], e["trials"], tuple(sorted(sizes.items())), e["seed"], e["haystack"])
    scored = (e.get("scoring", "exact"), e.get("generate"))
    return (*cell, e["dtype"], *scored, e.get("generator", 1), *positions_key(e), *checkpoint_key(e))


def check_memory(rows: int, length: int, generate: int, flag: str, available: int | None = None) -> None:
    """`ConfigError` (before anything is allocated) when `rows` episodes of one task × length, their prompts of
    `length` tokens and `generate` generated tokens (int64, a copy each) need more memory than is available."""
    need = rows * (EPISODE_BYTES + 16 * (length + generate))
    available = available_memory() if available is None else available
    if available is not None and need > available:
        raise ConfigError(
            f"{flag}: {rows:,} episodes per task × length at {length} tokens need about {need / 2**30:,.1f} GiB of "
            f"memory and {available / 2**30:,.1f} GiB is available; ask fewer trials or depths"
        )


def cell_rng(task: str, seed: int, length: int, depth: float | None) -> np.random.Generator:
    """Episodes of one cell depend only on these, not on which other cells are measured (depth None: 1,000,001)."""
    at = 1_000_001 if depth is None else round(depth * 1_000_000)
    return np.random.default_rng([seed, zlib.crc32(task.encode()), length, at])


def sample_episodes(
    tokenizer: Any,
    task: type[RetrievalTask],
    length: int,
    depths: Sequence[float | None],
    trials: int,
    sizes: Sizes,
    seed: int,
    budget: int | None,
) -> list[Episode]:
    """`trials` episodes per depth (depth-major) of one length; a context task's filled to the prompt that
    `build_prompts(..., length, reserve=budget)` builds (RULER sizes FWE's vocabulary by length − budget: with
    `budget` None, the task's own)."""
    room = length - (budget or task.tokens_to_generate)
    episodes, drafts = [], []
    for d in depths:
        rng = cell_rng(task.name, seed, length, d)
        if issubclass(task, ContextTask):
            try:
                drafts += [task.draft(rng, float(d or 0.0), sizes, room) for _ in range(trials)]
            except PromptTooShort as e:  # (FWE: too few prompt tokens for RULER's vocabulary)
                raise PromptTooShort(f"length {length}: {e}") from None
        else:
            episodes += [task.sample(rng, float(d or 0.0), sizes) for _ in range(trials)]
    return fill_episodes(tokenizer, drafts, length, budget) if drafts else episodes


def evaluate_task_model(
    model: torch.nn.Module,
    tokenizer: Any,
    task: type[RetrievalTask],
    *,
    length: int,
    depths: Sequence[float | None],
    trials: int,
    sizes: Sizes = RULER_SIZES,
    scoring: str = "contains",
    generate: int | None = None,
    seed: int = 0,
    haystack: np.ndarray | None = None,
    batch_tokens: int = 16384,
    dtype: str = "fp32",
    device: str | torch.device = "cpu",
    progress: Progress = None,
    positions: Positions | None = None,
) -> list[dict[str, Any]]:
    """Scores at one total `length` (prompt + generated tokens), one dict per depth: {score (mean share of answers
    found), exact (share of episodes with every answer found), samples}. `positions`: the ids fed
    (`passkey.decode_prompts`; default 0..length−1). `scoring` "contains": `generate` tokens
    (None: the task's RULER budget) scored by RULER's `string_match_all`; "exact": the answer's tokens, exact match.
    Raises `LengthBeyondScheme` before any forward when the model cannot read the prompt, `PromptTooShort` when no
    haystack fits, `BudgetTooShort` when the budget cannot hold the longest answer."""
    check_readable(model, length)
    budget = (task.tokens_to_generate if generate is None else generate) if scoring == "contains" else None
    episodes = sample_episodes(tokenizer, task, length, depths, trials, sizes, seed, budget)
    batch = build_prompts(tokenizer, episodes, length, haystack, budget)
    width = batch.answers.shape[1]
    if budget is not None and budget < width:
        raise BudgetTooShort(
            f"{budget} generated tokens cannot hold the longest answer ({width} tokens; --tokens-to-generate)"
        )
    steps = width if budget is None else budget
    label = f"{task.name} L={length}"
    generated = decode_prompts(
        model, batch.prompts, steps, length, batch_tokens, dtype, device, progress, label, positions=positions
    )  # (N, steps)
    if budget is None:  # exact: the answer's own tokens
        outputs = [tokenizer.decode(generated[r, : batch.answer_len[r]]) for r in range(len(episodes))]
    else:
        outputs = [tokenizer.decode(until_end(generated[r], tokenizer.eod_id)) for r in range(len(episodes))]
    scores = np.array([task.score(o, ep.answers, scoring) for o, ep in zip(outputs, episodes, strict=True)])  # (N,)
    cells = []
    for j, depth in enumerate(depths):
        rows = range(j * trials, (j + 1) * trials)
        samples = [{"answers": list(episodes[r].answers), "output": outputs[r]} for r in rows[:SAMPLES_PER_CELL]]
        cells.append(
            {
                "depth": None if depth is None else float(depth),
                "score": round(float(scores[rows.start : rows.stop].mean()), 6),
                "exact": round(float((scores[rows.start : rows.stop] == 1.0).mean()), 6),
                "samples": samples,
            }
        )
    return cells


def task_depths(task: type[RetrievalTask], depths: Sequence[float]) -> list[float | None]:
    """The depths of `task`'s cells: `depths`, or [None] for a task without depth."""
    return [float(d) for d in depths] if task.has_depth else [None]


def run_sizes(run: LoadedRun, cfg: TasksEvalConfig) -> tuple[Sizes, int | None]:
    """(episode sizes, generation budget or None) for `run`: its `data=tasks` mixture's, else RULER's sizes and no
    budget of its own; `cfg.sizes` and `cfg.digits` override the sizes."""
    data = run.config.data
    base, data_budget = RULER_SIZES, None
    if isinstance(data, TasksDataConfig):
        base, data_budget = data.sizes(), data.tokens_to_generate
    sizes = replace(base, **(cfg.sizes or {}))
    if cfg.digits is not None:
        sizes = replace(sizes, digits=cfg.digits)
    sizes.validate("--sizes ")
    return sizes, data_budget


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


def budget_of(cfg: TasksEvalConfig, data_budget: int | None, task: type[RetrievalTask]) -> int | None:
    """Tokens generated per episode of `task`: --tokens-to-generate, else the run's data.tokens_to_generate, else
    RULER's budget of the task; None for "exact" scoring (the answer's tokens)."""
    if cfg.scoring != "contains":
        return None
    return cfg.tokens_to_generate or data_budget or task.tokens_to_generate


def planned_lengths(cfg: TasksEvalConfig, run: LoadedRun) -> list[tuple[int, float]]:
    """(length, multiple of the run's base length) of every length `cfg` asks."""
    _, base_length = run.meta.lengths(run.config)
    return plan_lengths(EvalConfig(lengths=list(cfg.lengths), abs_lengths=cfg.abs_lengths), base_length)


class RetrievalEvalTask(EvalTask):
    """eval-tasks' evaluation of one retrieval task on one loaded run (subclassed per `posenc_cli.data.ruler` task at
    the end of this module). All tasks share `eval/tasks.json`; a length's depths are one group (one batch)."""

    command = COMMAND
    results_file = TASKS_FILE
    retrieval: ClassVar[type[RetrievalTask]]

    def __init__(
        self,
        run: LoadedRun,
        cfg: TasksEvalConfig,
        *,
        device: str | torch.device | None = None,
        progress: Progress = None,
    ) -> None:
        cfg.validate()
        super().__init__(run, device=device, progress=progress)
        self.cfg = cfg
        self.sizes, data_budget = run_sizes(run, cfg)
        self.budget = budget_of(cfg, data_budget, self.retrieval)
        self.dtype = resolve_dtype(cfg.dtype, run.meta.precision, self.device)
        self.positions = trained_positions(run.config)  # a randomized-position run reads at draws from its range
        self.planned = planned_lengths(cfg, run)
        check_memory(cfg.trials * len(cfg.depths), max(n for n, _ in self.planned), self.budget or 0, "--trials")
        self.haystack: tuple[np.ndarray | None, str] | None = None  # (token ids, label); read on first use

    @classmethod
    def for_job(
        cls, run: LoadedRun, cfg: Config, *, device: torch.device, progress: Progress = None
    ) -> RetrievalEvalTask | None:
        """eval-tasks' defaults at the job's `eval.lengths`; a `data=tasks` job measures only the tasks it trained."""
        if isinstance(cfg.data, TasksDataConfig) and cls.name not in cfg.data.tasks:
            return None
        return cls(run, TasksEvalConfig(lengths=cfg.eval.lengths), device=device)

    def haystack_of(self) -> tuple[np.ndarray | None, str]:
        """(token ids or None, label) of the haystack: RULER's filler, or the run's corpus (`corpus_haystack`)."""
        if self.haystack is None:
            longest = max(n for n, _ in self.planned)
            self.haystack = (
                corpus_haystack(self.run, 8 * longest) if self.cfg.haystack == "corpus" else (None, "filler")
            )
        return self.haystack

    def plan(self) -> Iterator[list[TaskEntry]]:
        task, cfg = self.retrieval, self.cfg
        _, hay_label = self.haystack_of()
        for length, multiple in self.planned:
            yield [
                TaskEntry(
                    task=task.name,
                    length=length,
                    multiple=multiple,
                    depth=d,
                    trials=cfg.trials,
                    sizes=self.sizes.of(task.size_names),
                    seed=cfg.seed,
                    haystack=hay_label,
                    scoring=cfg.scoring,
                    generate=self.budget,
                    dtype=self.dtype,
                    positions=self.positions.to_json(),
                )
                for d in task_depths(task, cfg.depths)
            ]

    key = staticmethod(entry_key)

    def measure(self, group: Sequence[TaskEntry]) -> list[TaskEntry]:
        if (beyond := self.positions.beyond_range(group[0].length)) is not None:
            return [c.not_measured(beyond) for c in group]
        hay_ids, _ = self.haystack_of()
        try:
            measured = evaluate_task_model(
                self.run.model,
                self.run.tokenizer,
                self.retrieval,
                length=group[0].length,
                depths=[c.depth for c in group],
                trials=self.cfg.trials,
                sizes=self.sizes,
                scoring=self.cfg.scoring,
                generate=self.budget,
                seed=self.cfg.seed,
                haystack=hay_ids,
                batch_tokens=self.cfg.batch_tokens,
                dtype=self.dtype,
                device=self.device,
                progress=self.progress,
                positions=self.positions,
            )
        except LengthBeyondScheme as e:  # the same reason text as eval-extrapolate
            return [c.not_measured(e.reason) for c in group]
        except PromptTooShort as e:
            return [c.not_measured(str(e)) for c in group]
        keys = ("score", "exact", "samples")
        return [c.measured(**{k: m[k] for k in keys}) for c, m in zip(group, measured, strict=True)]

    @classmethod
    def cell(cls, entry: dict[str, Any]) -> tuple[Any, ...]:
        depth = None if entry.get("depth") is None else float(entry["depth"])
        return entry["task"], scoring_of(entry), int(entry["length"]), depth

    @classmethod
    def current(cls, entry: dict[str, Any]) -> bool:
        """This task's cells of the current prompt generator (the file holds every retrieval task's)."""
        return entry.get("task") == cls.name and entry.get("generator", 1) == GENERATOR_VERSION

    @classmethod
    def summarise(
        cls, results: Sequence[dict[str, Any]], *, threshold: float | None = None, competence: float | None = None
    ) -> Summary | None:
        """The task's scores per run × length (the mean over depths), with the competence gate and RULER's effective
        length at `threshold` (None: RULER's)."""
        threshold = RULER_THRESHOLD if threshold is None else threshold
        competence = DEFAULT_COMPETENCE if competence is None else competence
        check_threshold(competence)
        gates = retrieval_gates(results, competence)
        tables = task_summary_tables(results, [cls.name], gates, threshold, competence)
        return Summary(cls.name, list(results), gates, list(tables)) if tables else None


def retrieval_gates(results: Sequence[dict[str, Any]], competence: float = DEFAULT_COMPETENCE) -> list[dict[Any, Any]]:
    """(task, scoring) -> the competence gate (`evaluation.competence`) of each run's eval-tasks result doc."""
    out = []
    for r in results:
        pairs = dict.fromkeys((str(e["task"]), scoring_of(e)) for e in r["entries"])
        out.append({(t, s): result_competence(r, t, "retrieval", competence, s) for t, s in pairs})
    return out


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
    length, then depth). Every task's settings are checked before any is measured, and the corpus haystack is read
    once for all."""
    cfg.validate()
    tasks = [task_for(name)(run, cfg, device=device, progress=progress) for name in names]
    force = cfg.force if force is None else force
    haystack = tasks[0].haystack_of()
    entries: list[dict[str, Any]] = []
    reused, not_saved = 0, None
    for task in tasks:
        task.haystack = haystack
        done = measure(task, force=force)
        entries += done.entries
        reused += done.reused
        not_saved = not_saved or done.not_saved
    header = tasks[0].header()  # DroPE: "rope, dropped at k"
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
    evaluate_loaded = partial(_evaluate_loaded, names=names, cfg=cfg, progress=progress)
    return evaluate_each_run(find_runs(paths), evaluate_loaded, device=device, threads=threads, on_run=on_run)


def _evaluate_loaded(
    run: LoadedRun, device: torch.device, *, names: Sequence[str], cfg: TasksEvalConfig, progress: Progress
) -> dict[str, Any]:
    return evaluate_tasks_run(run, names, cfg, device=device, progress=progress)


def combined_json(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """All runs' results in one JSON-safe document (for --json)."""
    return {"schema_version": 1, "runs": [{k: v for k, v in r.items() if k != "reused"} for r in results]}


def registry_task(name: str) -> type[RetrievalTask]:
    tasks = ruler_registry()
    if name not in tasks:
        raise ConfigError(f"unknown task '{name}' for eval-tasks (available: {', '.join(tasks)})")
    return tasks[name]


def task_for(name: str) -> type[RetrievalEvalTask]:
    """The registered evaluation task of retrieval task `name` (`ConfigError` naming eval-tasks' tasks if none)."""
    registry_task(name)
    return _BY_NAME[name]


_BY_NAME: dict[str, type[RetrievalEvalTask]] = {}
for _task in ruler_registry().values():
    _BY_NAME[_task.name] = register(
        type(f"{_task.__name__}EvalTask", (RetrievalEvalTask,), {"name": _task.name, "retrieval": _task})
    )
