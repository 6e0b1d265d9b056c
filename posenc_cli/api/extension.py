"""`posenc extend` as a function: `extend` plans the request (`extension.plan.plan_extension`: scale, remap, or
search then scale), carries it out (`extension.plan.execute`) and, with `evaluate=True`, measures parent and child
side by side as `extend --eval` does (`evaluate_pair`, which `calibrate(evaluate=True)` shares).

The flags of the command come from here too: `scaling_methods` (one `--<method>` shorthand each, its help panel's
title), `scaling_params` (one flag per method parameter) and `one_method` (the one method the flags named)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc_cli.rope_scaling import ParamField, ScalingMethod, get_method, param_fields, registry

if TYPE_CHECKING:
    from posenc_cli.extension.longrope_search import Progress
    from posenc_cli.extension.plan import ExtendOutcome
    from posenc_cli.extension.remap import RemapResult
    from posenc_cli.run.outcome import ExtendResult

    Child = ExtendResult | RemapResult  # the run `extend` writes: scaled, or remapped (the CLI's type hints)

__all__ = ["evaluate_pair", "extend", "one_method", "scaling_method", "scaling_methods", "scaling_params"]

Status = Callable[[str], None]


def extend(
    run: str | Path,
    out: str | Path | None = None,
    *,
    evaluate: bool = False,
    callback: Callable[[dict[str, Any]], None] | None = None,
    progress: Progress | None = None,
    status: Status | None = None,
    **request: Any,
) -> ExtendOutcome:
    """Extend RoPE run `run` into `out` (default: named after the method, beside the run), as `posenc extend` does
    with the same settings: `request` holds `extension.plan.ExtendRequest`'s fields (method, factor, params,
    finetune_steps, ..., factors, search, window, group, leaky, logn, threads; their defaults are the command's).
    `callback` receives a fine-tune's training events, `progress(done, budget, best_ppl)` a LongRoPE search's.
    Idempotent: a child already there is returned as is. The outcome holds the child's result (`ExtendResult`, or
    `RemapResult` for a remapping), and a search run now with the factors file it wrote.

    `evaluate=True` (`extend --eval`): perplexity by length at eval-extrapolate's default lengths on parent and
    child once the child is complete (`outcome.evaluation`, `evaluate_pair`; `status(message)` before each run);
    nothing is measured after an interrupted fine-tune."""
    # deferred: torch
    from posenc_cli.extension.plan import ExtendRequest, execute, plan_extension

    req = ExtendRequest(run=Path(run), out=Path(out) if out is not None else None, **request)
    outcome = execute(plan_extension(req), callback=callback, progress=progress)
    if evaluate and not outcome.interrupted:
        outcome.evaluation = evaluate_pair(outcome.result.parent_dir, outcome.result.out_dir, req.threads, status)
    return outcome


def evaluate_pair(
    parent: str | Path, child: str | Path, threads: int = 0, status: Status | None = None
) -> list[dict[str, Any]]:
    """Perplexity by length (eval-extrapolate's defaults) of `parent` then `child`, labelled as compare labels them
    (a sweep's job: its plan label): the child's cells are stored in it, the parent is never written. `status`
    receives "evaluating <dir> ..." before each."""
    # deferred: torch
    from posenc_cli.analysis.gather import labelled_in_order
    from posenc_cli.config import EvalConfig
    from posenc_cli.evaluation.corpus import CorpusCache
    from posenc_cli.evaluation.tasks.extrapolate import evaluate_run_dir

    cfg, corpora, docs = EvalConfig(), CorpusCache(), []
    for path, store in ((Path(parent), False), (Path(child), True)):  # the source run is never written
        if status is not None:
            status(f"evaluating {path} ...")
        docs.append(evaluate_run_dir(path, cfg, threads=threads, corpora=corpora, store=store))
    return labelled_in_order(docs)


def scaling_methods() -> dict[str, ScalingMethod]:
    """The RoPE scaling methods by name, oldest publication first (`rope_scaling.registry`): each has a `title`
    (its help panel), its parameters and whether it rescales per length (`length_dependent`)."""
    return registry()


def scaling_method(name: str) -> ScalingMethod:
    """The scaling method `name` (a one-line `ConfigError` for an unknown one)."""
    return get_method(name)


def scaling_params() -> dict[str, ParamField]:
    """Every scaling method's parameters by name (one `extend` flag each: name, type, default, help, metavar, the
    methods that read it)."""
    return param_fields()


def one_method(named: Sequence[str]) -> str | None:
    """The one method among those a command line named (`--method` and the `--<method>` shorthands); None when none
    was; a one-line `ConfigError` when several differ (`extension.plan.one_method`)."""
    # deferred: torch
    from posenc_cli.extension.plan import one_method as first

    return first(named)
