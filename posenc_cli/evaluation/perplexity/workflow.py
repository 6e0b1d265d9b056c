"""Evaluating one loaded run: plan its cells, measure or reuse each, store them (`evaluate_run`).

The linear load → plan → measure → write of `posenc eval-extrapolate` for one run: the cells come from
`planning.plan_cells`, each is measured by `measuring.evaluate_model` (or the streaming decoder) and stored through
the shared loop `loop.measure`, keyed by `results.entry_key`. Which position ids a run is fed (`run_positions`) and
the refusal to evaluate a run being trained (`check_not_training`) live here too.

LongPPL (`evaluation.longppl`) is measured when an evaluator is named (`eval.longppl_evaluator`, or a loaded
`evaluator.KeyEvaluator`) and `longppl` is not switched off: each cell's key tokens are the evaluator's
(`KeyEvaluator.keys`, chosen once and stored in its run directory), and the run is scored on exactly those targets;
the entry records the key set it was scored on (`longppl_evaluator`: the evaluator's name, checkpoint and key-set
id). A stored "ok" entry is reused only when it was scored on the same key set; any other (written before LongPPL,
with self-chosen key tokens as posenc did before, with another evaluator or none) is measured again, replacing the
entry in place (same key, same perplexity numbers), so no stored entry is shown as a LongPPL it did not measure.
Without an evaluator, or with `longppl=False`, plain perplexity only is measured, neither field is written and any
stored entry is reused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from posenc_cli.config import DataConfig, EvalConfig
from posenc_cli.errors import CheckpointError, ConfigError, LengthBeyondScheme
from posenc_cli.evaluation.corpus import CorpusCache, check_held_out, data_name
from posenc_cli.evaluation.loop import measure, results_header
from posenc_cli.evaluation.perplexity.entries import ExtrapolateEntry, filled
from posenc_cli.evaluation.perplexity.evaluator import KeyEvaluator, find_evaluator
from posenc_cli.evaluation.perplexity.measuring import Progress, evaluate_model
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
from posenc_cli.evaluation.results import (
    BEYOND_SCHEME,
    OK,
    checkpoint_identity,
    entry_key,
    results_path,
)
from posenc_cli.evaluation.streaming import evaluate_streaming
from posenc_cli.run.device import describe_device
from posenc_cli.run.interrupts import run_is_locked

if TYPE_CHECKING:
    from posenc_cli.data.cache import Corpus
    from posenc_cli.run.load import LoadedRun

__all__ = ["check_not_training", "config_positions", "evaluate_run", "longppl_evaluator", "run_positions"]


def evaluate_run(
    run: LoadedRun,
    cfg: EvalConfig,
    *,
    data: DataConfig | None = None,
    corpus: Corpus | None = None,
    corpora: CorpusCache | None = None,
    device: str | torch.device | None = None,
    force: bool | None = None,
    progress: Progress | None = None,
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
    checkpoint they measured, and a run being trained right now is refused (`check_not_training`). One cell per
    length, through the shared loop `loop.measure`.

    `positions` (None: the run's own, see `run_positions`): "random" feeds each window a sorted draw from [0, M) of
    a run trained with `train.random_positions=M` (seeded by `positions_seed`), "sequential" 0..T-1. `longppl`
    (None: `cfg.longppl`, `eval.longppl`) also measures LongPPL on the key tokens of `evaluator` (None: the run
    `cfg.longppl_evaluator` names, if any; see the module docstring).
    """
    cfg.validate()
    position_ids = run_positions(run, cfg, positions, positions_seed)
    check_not_training(run.path)
    force = cfg.force if force is None else force
    device = torch.device(device) if device is not None else next(run.model.parameters()).device
    if cfg.longppl if longppl is None else longppl:
        evaluator = evaluator or longppl_evaluator(run, cfg, device)
    else:
        evaluator = None
    if evaluator is not None:
        evaluator.check_tokenizer(run)
    train_length, base_length = run.meta.lengths(run.config)
    dtype = resolve_dtype(cfg.dtype, run.meta.precision, device)

    data_cfg = data if data is not None else run.config.data
    check_held_out(data_cfg, run.config.data, run.path)
    if corpus is None:
        corpus = (corpora or CorpusCache()).get(data_cfg, run)
    stream = corpus.val
    fingerprint = str(corpus.info.get("fingerprint") or "")
    checkpoint = checkpoint_identity(run.meta)
    context = CellContext(
        dtype=dtype,
        data={"name": data_name(data_cfg), "fingerprint": fingerprint},
        positions=position_ids.to_json(),
        checkpoint=checkpoint,
        device=describe_device(device),  # results depend on precision and hardware: record both
    )
    streaming = streaming_settings(cfg, base_length)
    if evaluator is not None and streaming is not None:
        raise ConfigError("LongPPL's evaluator scores window protocols; --protocol streaming has no LongPPL")
    tokenizer = str(run.tokenizer.fingerprint)

    def measure_cell(group: Sequence[ExtrapolateEntry]) -> list[ExtrapolateEntry]:
        (entry,) = group
        length, stride = entry.length, resolve_stride(cfg.protocol, entry.stride, entry.length, base_length)
        if entry.tokens == 0:
            reason = no_window_reason(cfg.protocol, len(stream), length, stride, cfg.tokens)
            return [replace(entry, status=no_window_status(cfg.protocol, length, stride), reason=reason)]
        if position_ids.beyond_range(length):  # T distinct ids from [0, M) need T <= M
            return [replace(entry, status=BEYOND_SCHEME, reason=position_ids.beyond_range(length))]
        try:
            if streaming is not None:
                result = evaluate_streaming(
                    run.model,
                    stream,
                    run.tokenizer.token_bytes,
                    length=length,
                    block=stride,
                    n_tokens=cfg.tokens,
                    batch_tokens=cfg.batch_tokens,
                    dtype=dtype,
                    device=device,
                    progress=progress,
                    **streaming,
                )
                return [filled(entry, result)]
            keys, stamp = None, None
            if evaluator is not None:
                keys, stamp = evaluator.keys(
                    entry.to_json(), stream, tokenizer, cfg, stride=stride, device=device, progress=progress
                )
            result = evaluate_model(
                run.model,
                stream,
                run.tokenizer.token_bytes,
                length=length,
                protocol=cfg.protocol,
                stride=stride,
                n_tokens=cfg.tokens,
                batch_tokens=cfg.batch_tokens,
                dtype=dtype,
                device=device,
                progress=progress,
                positions=position_ids,
                score_keys=keys,
            )
        except LengthBeyondScheme as e:  # same reason text at every length, so tables can group it
            return [replace(entry, status=BEYOND_SCHEME, reason=e.reason)]
        if stamp is not None:
            result["longppl_evaluator"] = stamp
        return [filled(entry, result)]

    header = results_header(run.path.name, run.scheme_label, train_length, base_length)  # DroPE: "rope, dropped at k"
    done = measure(
        results_path(run.path),
        "eval-extrapolate",
        header,
        checkpoint,
        plan_cells(cfg, base_length, len(stream), context),
        measure_cell,
        key=entry_key,
        force=force,
        store=store,
        reusable=None
        if evaluator is None
        else lambda stored: scored_on_keys(stored, evaluator, tokenizer, cfg, device),
    )
    out = dict(done.header)
    out.update(path=str(run.path), reused=done.reused, entries=done.entries, not_saved=done.not_saved)
    return out


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


def check_not_training(run_dir: Path) -> None:
    """Refuse to evaluate a run whose trainer holds its run lock: its weights are about to change.

    A stopped run (interrupted, or trained to its last step) is evaluated as it stands; its cells are keyed by that
    checkpoint, so training it further makes them stale (measured again) instead of wrong.
    """
    if run_is_locked(run_dir):
        raise CheckpointError(f"{run_dir} is being trained by another process; evaluate it once training has stopped")
