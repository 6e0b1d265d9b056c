"""`extrapolate`: perplexity at and beyond the training length (`posenc eval-extrapolate`; planning, measuring,
entries and LongPPL's evaluator in `posenc_cli.evaluation.perplexity`).

One cell per length: `plan` is `planning.plan_cells`, `measure` runs `measuring.evaluate_model` (or the streaming
decoder) on the run's validation stream, the key is `results.entry_key`. `evaluate_run` is the linear load → plan →
measure → write of eval-extrapolate for one loaded run; `evaluate_paths` / `evaluate_run_dir` hand each run found under
directories to it (`runs.evaluate_each_run`: one model in memory at a time) with the data overrides composed per run
and one LongPPL evaluator shared by all (`RunEvaluator`). Which position ids a run is fed (`run_positions`) lives
here too.

LongPPL (`evaluation.longppl`) is measured when an evaluator is named (`eval.longppl_evaluator`, or a loaded
`evaluator.KeyEvaluator`) and `longppl` is not switched off: each cell's key tokens are the evaluator's
(`KeyEvaluator.keys`, chosen once and stored in its run directory), and the run is scored on exactly those targets;
the entry records the key set it was scored on (`longppl_evaluator`: the evaluator's name, checkpoint and key-set
id). A stored "ok" entry is reused only when it was scored on the same key set (`ExtrapolateTask.reusable`); any
other (written before LongPPL, with self-chosen key tokens as posenc did before, with another evaluator or none) is
measured again, replacing the entry in place (same key, same perplexity numbers), so no stored entry is shown as a
LongPPL it did not measure. Without an evaluator, or with `longppl=False`, plain perplexity only is measured, neither
field is written and any stored entry is reused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from posenc_cli.config import DataConfig, EvalConfig
from posenc_cli.errors import ConfigError, LengthBeyondScheme
from posenc_cli.evaluation.corpus import CorpusCache, check_held_out, data_config_with_overrides, data_name
from posenc_cli.evaluation.loop import evaluate
from posenc_cli.evaluation.perplexity.entries import ExtrapolateEntry, filled
from posenc_cli.evaluation.perplexity.evaluator import KeyEvaluator, find_evaluator
from posenc_cli.evaluation.perplexity.measuring import evaluate_model
from posenc_cli.evaluation.perplexity.planning import (
    CellContext,
    no_window_reason,
    no_window_status,
    plan_cells,
    resolve_dtype,
    resolve_stride,
    streaming_settings,
)
from posenc_cli.evaluation.positions import Positions, draw_layers, resolve_positions
from posenc_cli.evaluation.results import BEYOND_SCHEME, EXTRAPOLATE_FILE, OK, entry_key
from posenc_cli.evaluation.runs import checked_runs, evaluate_each_run
from posenc_cli.evaluation.streaming import evaluate_streaming
from posenc_cli.evaluation.tasks import register
from posenc_cli.evaluation.tasks.base import EvalTask, Progress
from posenc_cli.run.device import describe_device

if TYPE_CHECKING:
    from posenc_cli.config import Config
    from posenc_cli.data.cache import Corpus
    from posenc_cli.run.load import LoadedRun

__all__ = [
    "ExtrapolateTask",
    "RunEvaluator",
    "config_positions",
    "evaluate_paths",
    "evaluate_run",
    "evaluate_run_dir",
    "longppl_evaluator",
    "run_positions",
]


@register
class ExtrapolateTask(EvalTask):
    """eval-extrapolate on one loaded run with `cfg` (see `evaluate_run` for the arguments)."""

    name = "extrapolate"
    command = "eval-extrapolate"
    results_file = EXTRAPOLATE_FILE
    profiled_per_length = True

    def __init__(
        self,
        run: LoadedRun,
        cfg: EvalConfig,
        *,
        data: DataConfig | None = None,
        corpus: Corpus | None = None,
        corpora: CorpusCache | None = None,
        device: str | torch.device | None = None,
        progress: Progress = None,
        positions: str | None = None,
        positions_seed: int = 0,
        longppl: bool | None = None,
        evaluator: KeyEvaluator | None = None,
    ) -> None:
        cfg.validate()
        check_scored_every_token(run.config, run.path)
        self.position_ids = run_positions(run, cfg, positions, positions_seed)
        super().__init__(run, device=device, progress=progress)
        self.cfg = cfg
        if cfg.longppl if longppl is None else longppl:
            evaluator = evaluator or longppl_evaluator(run, cfg, self.device)
        else:
            evaluator = None
        if evaluator is not None:
            evaluator.check_tokenizer(run)
        self.evaluator = evaluator
        _, self.base_length = run.meta.lengths(run.config)
        self.dtype = resolve_dtype(cfg.dtype, run.meta.precision, self.device)
        data_cfg = data if data is not None else run.config.data
        check_held_out(data_cfg, run.config.data, run.path)
        if corpus is None:
            corpus = (corpora or CorpusCache()).get(data_cfg, run)
        self.stream = corpus.val
        self.data = {"name": data_name(data_cfg), "fingerprint": str(corpus.info.get("fingerprint") or "")}
        self.streaming = streaming_settings(cfg, self.base_length)
        if evaluator is not None and self.streaming is not None:
            raise ConfigError("LongPPL's evaluator scores window protocols; --protocol streaming has no LongPPL")
        self.tokenizer = str(run.tokenizer.fingerprint)

    @classmethod
    def for_job(
        cls, run: LoadedRun, cfg: Config, *, device: torch.device, progress: Progress = None
    ) -> ExtrapolateTask:
        """The job's `eval` settings on the run's own validation split, fed the run's own positions (a job trained
        with `train.random_positions=M` is fed sorted draws from [0, M), as in training: `run_positions`); None
        for a job trained on answer tokens only (`check_scored_every_token`)."""
        if cfg.train.loss_on == "answer":
            return None
        return cls(run, cfg.eval, device=device, progress=progress)

    def plan(self) -> Iterator[list[ExtrapolateEntry]]:
        context = CellContext(
            dtype=self.dtype,
            data=self.data,
            positions=self.position_ids.to_json(),
            device=describe_device(self.device),  # results depend on precision and hardware: record both
        )
        return plan_cells(self.cfg, self.base_length, len(self.stream), context)

    key = staticmethod(entry_key)

    def reusable(self, stored: dict[str, Any]) -> bool:
        """With LongPPL asked for, a stored "ok" entry must have been scored on the evaluator's key set now."""
        if self.evaluator is None:
            return True
        return scored_on_keys(stored, self.evaluator, self.tokenizer, self.cfg, self.device)

    def measure(self, group: Sequence[ExtrapolateEntry]) -> list[ExtrapolateEntry]:
        (entry,) = group
        cfg, run = self.cfg, self.run
        length, stride = entry.length, resolve_stride(cfg.protocol, entry.stride, entry.length, self.base_length)
        if entry.tokens == 0:
            reason = no_window_reason(cfg.protocol, len(self.stream), length, stride, cfg.tokens)
            return [entry.not_measured(reason, no_window_status(cfg.protocol, length, stride))]
        if (beyond := self.position_ids.beyond_range(length)) is not None:  # T distinct ids from [0, M): T <= M
            return [entry.not_measured(beyond, BEYOND_SCHEME)]
        options: dict[str, Any] = {
            "length": length,
            "n_tokens": cfg.tokens,
            "batch_tokens": cfg.batch_tokens,
            "dtype": self.dtype,
            "device": self.device,
            "progress": self.progress,
        }
        try:
            if self.streaming is not None:
                result = evaluate_streaming(
                    run.model, self.stream, run.tokenizer.token_bytes, block=stride, **options, **self.streaming
                )
                return [filled(entry, result)]
            keys, stamp = None, None
            if self.evaluator is not None:
                keys, stamp = self.evaluator.keys(
                    entry.to_json(),
                    self.stream,
                    self.tokenizer,
                    cfg,
                    stride=stride,
                    device=self.device,
                    progress=self.progress,
                )
            result = evaluate_model(
                run.model,
                self.stream,
                run.tokenizer.token_bytes,
                protocol=cfg.protocol,
                stride=stride,
                positions=self.position_ids,
                score_keys=keys,
                **options,
            )
        except LengthBeyondScheme as e:  # same reason text at every length, so tables can group it
            return [entry.not_measured(e.reason, BEYOND_SCHEME)]
        if stamp is not None:
            result["longppl_evaluator"] = stamp
        return [filled(entry, result)]


def evaluate_run(
    run: LoadedRun,
    cfg: EvalConfig,
    *,
    data: DataConfig | None = None,
    corpus: Corpus | None = None,
    corpora: CorpusCache | None = None,
    device: str | torch.device | None = None,
    force: bool | None = None,
    progress: Progress = None,
    store: bool = True,
    positions: str | None = None,
    positions_seed: int = 0,
    longppl: bool | None = None,
    evaluator: KeyEvaluator | None = None,
) -> dict[str, Any]:
    """Measure (or reuse) every length of `cfg` for a loaded run and store the entries in its results file.

    Scores the run's own validation split unless `data` (another data config, tokenized with the run's tokenizer)
    or a ready `corpus` is given. Returns the results doc restricted to this call's entries, in length order, plus
    "path", "reused" (how many entries came from the file without a forward) and "not_saved" (None, or why the
    results file could not be written, e.g. read-only storage: the scores are returned all the same). `store=False`
    writes nothing into the run (`extend --eval` scoring the source run it must not modify). Entries are keyed by the
    checkpoint they measured, and a run being trained right now is refused (`loop.check_not_training`). One cell per
    length, through the shared loop `loop.evaluate`.

    `positions` (None: the run's own, see `run_positions`): "random" feeds each window a sorted draw from [0, M) of
    a run trained with `train.random_positions=M` (seeded by `positions_seed`), "sequential" 0..T-1. `longppl`
    (None: `cfg.longppl`, `eval.longppl`) also measures LongPPL on the key tokens of `evaluator` (None: the run
    `cfg.longppl_evaluator` names, if any; see the module docstring).
    """
    task = ExtrapolateTask(
        run,
        cfg,
        data=data,
        corpus=corpus,
        corpora=corpora,
        device=device,
        progress=progress,
        positions=positions,
        positions_seed=positions_seed,
        longppl=longppl,
        evaluator=evaluator,
    )
    return evaluate(task, force=cfg.force if force is None else force, store=store)


def scored_on_keys(
    stored: dict[str, Any], evaluator: KeyEvaluator, tokenizer: str, cfg: EvalConfig, device: torch.device
) -> bool:
    """Whether a stored entry can stand for a cell scored on `evaluator`'s key tokens: any state but "ok" (nothing
    to measure), or an "ok" entry scored on the key set the evaluator would give it now."""
    if stored.get("status") != OK:
        return True
    recorded = stored.get("longppl_evaluator") or {}
    return recorded.get("keys") == evaluator.stamp(evaluator.identity(stored, tokenizer, cfg, device))["keys"]


def longppl_evaluator(run: LoadedRun, cfg: EvalConfig, device: torch.device) -> KeyEvaluator | None:
    """The evaluator `cfg.longppl_evaluator` names (a relative path is also looked up above the run's directory,
    `evaluator.find_evaluator`), loaded; the run itself when it names the run; None when it names none."""
    if not cfg.longppl_evaluator:
        return None
    path = find_evaluator(cfg.longppl_evaluator, near=run.path)
    if path.resolve() == Path(run.path).resolve():
        return KeyEvaluator(run)
    return KeyEvaluator.load(path, device=device)


def check_scored_every_token(config: Any, path: Path) -> None:
    """ConfigError for a run (its saved `config`) trained on answer tokens only (`train.loss_on=answer`): its
    perplexity over every token of a text would score tokens it never trained to predict. Its task evaluations
    measure what it learned."""
    if config.train.loss_on == "answer":
        raise ConfigError(
            f"{path}: trained on answer tokens only (train.loss_on=answer), so perplexity over every token "
            "measures nothing it trained on; score it with its task (eval-tasks, eval-algorithmic, eval-passkey)"
        )


def run_positions(run: LoadedRun, cfg: EvalConfig, requested: str | None, seed: int = 0) -> Positions:
    """The position ids to feed `run` (`positions.resolve_positions` on its `train.random_positions`).

    The streaming protocol assigns positions inside its cache (`streaming`), so it is always sequential there, and
    asking for random with it is a `ConfigError`.
    """
    return config_positions(run.config, run.path, cfg, requested, seed)


def config_positions(config: Any, path: Path, cfg: EvalConfig, requested: str | None, seed: int = 0) -> Positions:
    """`run_positions` from a run's config alone (checked before the run is loaded)."""
    train = getattr(config, "train", None)
    random_range = int(getattr(train, "random_positions", 0) or 0)
    if cfg.protocol == "streaming":
        if requested == "random":
            raise ConfigError("--positions random does not apply to --protocol streaming (positions are the cache's)")
        return Positions()
    return resolve_positions(requested, random_range, seed, run=str(path), layers=draw_layers(config))


# ----------------------------------------------------------------------------------------------------------------
# Runs found under directories, each loaded in turn (`runs.evaluate_each_run`) and evaluated with the same settings.


@dataclass
class RunEvaluator:
    """`evaluate_run` with these settings on each loaded run (`runs.evaluate_each_run` calls it), the run's data
    config composed with `data_overrides`. The LongPPL evaluator `cfg.longppl_evaluator` names is loaded once, at the
    first run that needs it, and shared."""

    cfg: EvalConfig
    data_overrides: Sequence[str] = ()
    force: bool | None = None
    progress: Progress = None
    corpora: CorpusCache | None = None
    store: bool = True
    positions: str | None = None
    positions_seed: int = 0
    longppl: bool | None = None
    loaded: KeyEvaluator | None = None

    def evaluator_for(self, run: LoadedRun, device: torch.device) -> KeyEvaluator | None:
        cfg = self.cfg
        if not (cfg.longppl_evaluator and (cfg.longppl if self.longppl is None else self.longppl)):
            return None
        path = find_evaluator(cfg.longppl_evaluator, near=run.path)
        if path.resolve() == Path(run.path).resolve():
            return KeyEvaluator(run, self.loaded.memo if self.loaded is not None else {})
        if self.loaded is None or self.loaded.path.resolve() != path.resolve():
            self.loaded = KeyEvaluator.load(path, device=device)
        return self.loaded

    def __call__(self, run: LoadedRun, device: torch.device) -> dict[str, Any]:
        overrides = self.data_overrides
        return evaluate_run(
            run,
            self.cfg,
            data=data_config_with_overrides(run.config.data, overrides) if overrides else None,
            corpora=self.corpora,
            device=device,
            force=self.force,
            progress=self.progress,
            store=self.store,
            positions=self.positions,
            positions_seed=self.positions_seed,
            longppl=self.longppl,
            evaluator=self.evaluator_for(run, device),
        )


def evaluate_run_dir(
    run_dir: Path | str,
    cfg: EvalConfig,
    *,
    data_overrides: Sequence[str] = (),
    device: str | torch.device = "auto",
    threads: int = 0,
    force: bool | None = None,
    progress: Progress | None = None,
    corpora: CorpusCache | None = None,
    store: bool = True,
    positions: str | None = None,
    positions_seed: int = 0,
    longppl: bool | None = None,
) -> dict[str, Any]:
    """Load one run directory and `evaluate_run` it (data overrides compose only the data group)."""
    evaluate = RunEvaluator(cfg, data_overrides, force, progress, corpora, store, positions, positions_seed, longppl)
    (result,) = evaluate_each_run([run_dir], evaluate, device=device, threads=threads)
    return result


def evaluate_paths(
    paths: Sequence[Path | str],
    cfg: EvalConfig,
    *,
    data_overrides: Sequence[str] = (),
    device: str | torch.device = "auto",
    threads: int = 0,
    force: bool | None = None,
    progress: Progress | None = None,
    on_run: Callable[[Path, int, int], None] | None = None,
    on_skip: Callable[[Path, str], None] | None = None,
    positions: str | None = None,
    positions_seed: int = 0,
    longppl: bool | None = None,
) -> list[dict[str, Any]]:
    """Find the runs below `paths`, check them all and the settings against each (`runs.checked_runs`), then
    evaluate each in turn (one model in memory at a time). Without `on_skip` a run that cannot be read is an error,
    wherever it came from. `longppl` as `tasks.extrapolate.evaluate_run`'s; the LongPPL evaluator
    `cfg.longppl_evaluator` names is checked for every run before any is measured (`evaluator.find_evaluator`)."""
    cfg.validate()

    def check(config: Any, path: Path) -> None:  # the settings must fit every run before any is measured
        check_scored_every_token(config, path)
        config_positions(config, path, cfg, positions)
        if data_overrides:
            check_held_out(data_config_with_overrides(config.data, data_overrides), config.data, path)

    runs, searched = checked_runs(paths, check=check, on_skip=on_skip)
    if cfg.longppl_evaluator and (cfg.longppl if longppl is None else longppl):
        for run in runs:
            find_evaluator(cfg.longppl_evaluator, near=run)
    evaluate = RunEvaluator(
        cfg,
        data_overrides,
        force,
        progress,
        CorpusCache(),
        positions=positions,
        positions_seed=positions_seed,
        longppl=longppl,
    )
    return evaluate_each_run(
        runs, evaluate, device=device, threads=threads, on_run=on_run, skippable=searched, on_skip=on_skip
    )
