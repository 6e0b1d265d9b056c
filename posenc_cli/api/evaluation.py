"""`posenc eval-extrapolate` and `eval-passkey` as functions: `eval_config` (the perplexity settings, checked
together), `evaluate`, which measures (or reads back) every run's perplexity per length and returns an `Evaluation`,
and `evaluate_passkey`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from posenc_cli.analysis.gather import labelled_in_order
from posenc_cli.config import EvalConfig, build_dataclass
from posenc_cli.errors import ConfigError

__all__ = ["Evaluation", "eval_config", "evaluate", "evaluate_passkey"]

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
    cfg.validate()
    if cfg.stride is not None and cfg.protocol not in ("sliding", "streaming"):
        raise ConfigError(
            "--stride applies to --protocol sliding or streaming only (nonoverlap scores every token of a window)"
        )
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

    @property
    def reused(self) -> int:
        """Cells read back from the runs' eval/extrapolate.json rather than measured now."""
        return sum(r["reused"] for r in self.results)

    @property
    def cells(self) -> int:
        return sum(len(r["entries"]) for r in self.results)


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
    from posenc_cli.evaluation.perplexity import evaluate_paths
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
# eval-passkey


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
    progress: Callable[[str, int, int], None] | None = None,
    on_run: Callable[[Path, int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Passkey retrieval of every run below `runs` (`evaluation.passkey`): exact match of a key hidden at each depth
    of prompts of each length (`lengths`: multiples of the base length, default 1,2,4,8; or `abs_lengths`), stored in
    each run's eval/passkey.json (cells already there reused unless `force`). A grid no memory can hold for these
    runs is refused before anything is measured. One result doc per run, in the order found."""
    # deferred: torch
    from posenc_cli.evaluation.grid import check_grid_fits
    from posenc_cli.evaluation.passkey import PasskeyConfig, evaluate_passkey_paths
    from posenc_cli.run.device import resolve_device

    if not runs:
        raise ConfigError("give at least one run directory (or a sweep directory holding runs)")
    if lengths is not None and abs_lengths is not None:
        raise ConfigError("give either --lengths (multiples of the base length) or --abs-lengths (tokens), not both")
    if dtype not in ("auto", "fp32", "bf16"):
        raise ConfigError(f"--dtype must be auto, fp32 or bf16, got {dtype!r}")
    cfg = PasskeyConfig(trials=trials, digits=digits, seed=seed, batch_tokens=batch_tokens, dtype=dtype, force=force)
    for name, values in (("lengths", lengths), ("abs_lengths", abs_lengths), ("depths", depths)):
        if values is not None:
            setattr(cfg, name, list(values))
    paths = [str(p) for p in runs]
    check_grid_fits(cfg, paths)
    cfg.validate()
    run_device = resolve_device(device, "--device")
    return evaluate_passkey_paths(paths, cfg, device=run_device, threads=threads, progress=progress, on_run=on_run)
