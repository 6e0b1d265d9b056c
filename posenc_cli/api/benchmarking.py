"""`posenc bench` as functions: `bench` measures training throughput (against transformers' Llama), the matmul peak,
MFU and long-context evaluation; `cost_curve` the time per token and peak memory of an evaluation forward by length.
Each can write its results; the progress messages go to `progress(message)`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posenc_cli.api.training import train_config
from posenc_cli.config import Config

__all__ = ["bench", "cost_curve"]

Message = Callable[[str], None]


def bench(
    overrides: Sequence[str] | Config = (),
    *,
    rounds: int = 5,
    dtypes: Sequence[str] = ("fp32", "bf16"),
    vs_hf: bool = False,
    train: bool = True,
    evaluate: bool = True,
    schemes: Sequence[str] = ("nope", "rope", "alibi"),
    multiples: Sequence[int] = (1, 8, 32),
    round_seconds: float = 1.0,
    time_budget: float | None = None,
    json_path: str | Path | None = None,
    config_dir: str | Path | None = None,
    progress: Message | None = None,
) -> dict[str, Any]:
    """`posenc bench` on the config composed from `overrides` or given as a `Config` (model, train.seq_len, batch
    size, device, threads): training cases in interleaved rounds (`vs_hf`: also transformers' Llama of matching
    dims), evaluation cases (scheme × length, `multiples` of train.seq_len) each in its own process;
    `perf.bench.run_bench`'s result, also written to `json_path` when given. `time_budget`: wall seconds of the
    whole benchmark (None or 0: none)."""
    # deferred: torch
    from posenc_cli.fsutil import atomic_write_json
    from posenc_cli.perf.bench import BenchOptions, run_bench

    cfg = overrides if isinstance(overrides, Config) else train_config(overrides, config_dir=config_dir)
    opts = BenchOptions(
        rounds=rounds,
        dtypes=tuple(dtypes),
        vs_hf=vs_hf,
        train=train,
        eval=evaluate,
        eval_schemes=tuple(schemes),
        eval_multiples=tuple(multiples),
        round_seconds=round_seconds,
        time_budget_s=time_budget or None,
    )
    result = run_bench(cfg, opts, progress=progress or (lambda message: None))
    if json_path:
        atomic_write_json(Path(json_path), result)
    return result


def cost_curve(
    overrides: Sequence[str] | Config = (),
    *,
    lengths: Sequence[int],
    schemes: Sequence[str] | None = None,
    memory_limit: float = 24.0,
    time_budget: float = 300.0,
    json_path: str | Path | None = None,
    csv_path: str | Path | None = None,
    plot_path: str | Path | None = None,
    config_dir: str | Path | None = None,
    progress: Message | None = None,
) -> dict[str, Any]:
    """`posenc bench --eval-lengths` on the config of `overrides` (or that `Config`): time per token and peak
    memory of an evaluation forward (batch 1) at `lengths` tokens for `schemes` (None: every registered one), in
    train.precision, within `memory_limit` GiB and `time_budget` seconds per scheme (0: none);
    `perf.cost_curve.run_curve`'s result, also written as JSON, CSV and a plot (png, svg, pdf) where paths are
    given. The paths are checked before anything is measured."""
    # deferred: torch
    from posenc_cli.errors import ConfigError
    from posenc_cli.fsutil import atomic_write_json, atomic_write_text
    from posenc_cli.perf.cost_curve import CurveOptions, csv_text, run_curve
    from posenc_cli.report.output_files import check_writable_dir
    from posenc_cli.report.plots import figure_format, save_figure

    cfg = overrides if isinstance(overrides, Config) else train_config(overrides, config_dir=config_dir)
    opts = CurveOptions(
        lengths=tuple(lengths),
        schemes=tuple(schemes) if schemes is not None else None,
        memory_limit_gib=memory_limit,
        time_budget_s=time_budget or None,
    )
    opts.validate()
    for path in (json_path, csv_path):  # fail before the measuring, not after it
        if path and Path(path).is_dir():
            raise ConfigError(f"cannot write {path}: it is a directory")
        if path:
            check_writable_dir(Path(path).parent, shown=str(path))
    if plot_path:
        figure_format(str(plot_path))
    result = run_curve(cfg, opts, progress=progress or (lambda message: None))
    if json_path:
        atomic_write_json(Path(json_path), result)
    if csv_path:
        atomic_write_text(Path(csv_path), csv_text(result))
    if plot_path:
        # deferred: matplotlib only when a plot is asked for
        from posenc_cli.perf.cost_plot import cost_curve_figure

        save_figure(cost_curve_figure(result), plot_path)
    return result
