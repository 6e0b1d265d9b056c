"""Runs found under directories, loaded one at a time and evaluated (`evaluate_paths`, `evaluate_run_dir`).

Finding and checking the runs is `evaluation.runs` (`find_runs`, `checked_runs`); here each found run directory
(posenc's or an exported Hugging Face one) is loaded in turn, one model in memory at a time, and handed to an
evaluation (`evaluate_each_run`, which every evaluation command and the sweep share), and `evaluate_paths` /
`evaluate_run_dir` hand each to `workflow.evaluate_run` with the data overrides composed per run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from posenc_cli.config import EvalConfig
from posenc_cli.errors import UserError
from posenc_cli.evaluation.corpus import CorpusCache, check_held_out, data_config_with_overrides
from posenc_cli.evaluation.perplexity.evaluator import KeyEvaluator, find_evaluator
from posenc_cli.evaluation.perplexity.measuring import Progress
from posenc_cli.evaluation.perplexity.workflow import config_positions, evaluate_run
from posenc_cli.evaluation.runs import checked_runs, named_error
from posenc_cli.run.device import resolve_device
from posenc_cli.run.device import threads as use_threads
from posenc_cli.run.hf_run import is_hf_dir, load_hf_run
from posenc_cli.run.load import load_run

if TYPE_CHECKING:
    from posenc_cli.run.load import LoadedRun

__all__ = ["evaluate_each_run", "evaluate_paths", "evaluate_run_dir"]


def evaluate_each_run(
    run_dirs: Sequence[Path | str],
    evaluate: Callable[[LoadedRun, torch.device], dict[str, Any]],
    *,
    device: str | torch.device = "auto",
    threads: int = 0,
    on_run: Callable[[Path, int, int], None] | None = None,
    skippable: Iterable[Path] = (),
    on_skip: Callable[[Path, str], None] | None = None,
) -> list[dict[str, Any]]:
    """Load each run directory in turn (one model in memory at a time) and collect `evaluate(run, device)`.

    A run of `skippable` (found by a search, not named) that fails to load is left out with `on_skip(run, why)`;
    any other failure to load raises, naming the run.
    """
    device = resolve_device(device)
    may_skip = {Path(p).resolve() for p in skippable}
    results = []
    with use_threads(threads):
        for i, path in enumerate(run_dirs):
            if on_run is not None:
                on_run(Path(path), i, len(run_dirs))
            try:
                run = load_hf_run(path, device=device) if is_hf_dir(path) else load_run(path, device=device)
            except UserError as e:
                if Path(path).resolve() not in may_skip or on_skip is None:
                    raise named_error(Path(path), e) from e
                on_skip(Path(path), str(named_error(Path(path), e)))
                continue
            results.append(evaluate(run, device))
            del run
    return results


def _run_evaluator(
    cfg: EvalConfig,
    data_overrides: Sequence[str],
    force: bool | None,
    progress: Progress | None,
    corpora: CorpusCache | None,
    store: bool = True,
    positions: str | None = None,
    positions_seed: int = 0,
    longppl: bool | None = None,
) -> Callable[[LoadedRun, torch.device], dict[str, Any]]:
    """`evaluate_run` with these settings, on each run's data config composed with `data_overrides`. The LongPPL
    evaluator `cfg.longppl_evaluator` names is loaded once, at the first run that needs it, and shared."""
    loaded: list[KeyEvaluator] = []

    def evaluate(run: LoadedRun, device: torch.device) -> dict[str, Any]:
        data = data_config_with_overrides(run.config.data, data_overrides) if data_overrides else None
        evaluator = None
        if cfg.longppl_evaluator and (cfg.longppl if longppl is None else longppl):
            path = find_evaluator(cfg.longppl_evaluator, near=run.path)
            if path.resolve() == Path(run.path).resolve():
                evaluator = KeyEvaluator(run, loaded[0].memo if loaded else {})
            else:
                if not loaded or loaded[0].path.resolve() != path.resolve():
                    loaded[:] = [KeyEvaluator.load(path, device=device)]
                evaluator = loaded[0]
        return evaluate_run(
            run,
            cfg,
            data=data,
            corpora=corpora,
            device=device,
            force=force,
            progress=progress,
            store=store,
            positions=positions,
            positions_seed=positions_seed,
            longppl=longppl,
            evaluator=evaluator,
        )

    return evaluate


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
    evaluate = _run_evaluator(cfg, data_overrides, force, progress, corpora, store, positions, positions_seed, longppl)
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
    wherever it came from. `longppl` as `workflow.evaluate_run`'s; the LongPPL evaluator `cfg.longppl_evaluator`
    names is checked for every run before any is measured (`evaluator.find_evaluator`)."""
    cfg.validate()

    def check(config: Any, path: Path) -> None:  # the settings must fit every run before any is measured
        config_positions(config, path, cfg, positions)
        if data_overrides:
            check_held_out(data_config_with_overrides(config.data, data_overrides), config.data, path)

    runs, searched = checked_runs(paths, check=check, on_skip=on_skip)
    if cfg.longppl_evaluator and (cfg.longppl if longppl is None else longppl):
        for run in runs:
            find_evaluator(cfg.longppl_evaluator, near=run)
    evaluate = _run_evaluator(
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
