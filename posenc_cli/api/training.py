"""`posenc train` as a function: the config it runs (`train_config`), the checks before it (`train_warning`), and
`train`, which trains into a run directory and returns the `TrainResult`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc_cli.config import Config, config_to_dict
from posenc_cli.errors import ConfigError
from posenc_cli.run.config_compose import check_override_list
from posenc_cli.run.config_load import config_from_dict, merge_dotlist
from posenc_cli.run.load import read_config
from posenc_cli.run.meta import read_meta

if TYPE_CHECKING:
    from posenc_cli.run.outcome import TrainResult

__all__ = ["is_main_process", "resumed_config", "train", "train_config", "train_warning"]

PathLike = str | Path
Event = Callable[[dict[str, Any]], None]


def train_config(
    overrides: Sequence[str] = (),
    *,
    out: PathLike | None = None,
    resume: PathLike | None = None,
    config_dir: PathLike | None = None,
) -> Config:
    """The config `train` would run: composed from Hydra-style `overrides` (`pos=alibi train.steps=600`), or with
    `resume` the run's saved config with dotted overrides (`train.steps=800`) applied on top."""
    overrides = check_override_list(overrides)  # one string holding several: refused in one line
    if resume is not None:
        if out is not None and Path(out).resolve() != Path(resume).resolve():
            raise ConfigError("--out and --resume name different directories; give one of them")
        return resumed_config(Path(resume), list(overrides))
    # deferred: Hydra's compose API costs a second of import
    from posenc_cli.run.config_compose import compose_config

    return compose_config(list(overrides), Path(config_dir) if config_dir else None)


def resumed_config(run_dir: Path, overrides: list[str]) -> Config:
    """The config saved in `run_dir`, with dotted overrides (train.steps=800) applied on top."""
    for o in overrides:
        key = o.split("=", 1)[0]
        if key.startswith(("+", "~")) or "." not in key:
            raise ConfigError(f"with --resume, overrides must set single keys such as train.steps=800 (got '{o}')")
    cfg = read_config(run_dir, read_meta(run_dir))
    if not overrides:
        return cfg
    return config_from_dict(merge_dotlist(config_to_dict(cfg), overrides))  # type: ignore[arg-type]


def train_warning(cfg: Config) -> str | None:
    """Refuse a config that cannot run here (`run.train.check_budget`, which `train` checks again), then the
    busy-machine advice for it, if any (`cpu_load.training_busy_warning`; only the main process of a torchrun)."""
    # deferred: torch
    from posenc_cli.cpu_load import training_busy_warning
    from posenc_cli.run.distributed import env_info
    from posenc_cli.run.train import check_budget

    check_budget(cfg)
    busy = training_busy_warning(cfg.train.device, cfg.train.threads)
    return busy if busy and env_info().is_main else None


def is_main_process() -> bool:
    """Whether this process reports (`run.distributed.env_info`): always outside torchrun, only rank 0 under it."""
    # deferred: torch
    from posenc_cli.run.distributed import env_info

    return env_info().is_main


def train(
    overrides: Sequence[str] | Config = (),
    out: PathLike | None = None,
    *,
    resume: PathLike | None = None,
    force_config: bool = False,
    config_dir: PathLike | None = None,
    callback: Event | None = None,
    progress: bool | None = None,
) -> TrainResult:
    """Train one model into run directory `out` (default outputs/runs/<time>-<pos>-<model>), continuing the run
    already there; `resume`: continue the run in that directory with its saved config (`overrides` then set single
    keys). `overrides` may be a `Config` (`train_config`'s). A changed config is refused unless `force_config`; a
    finished run returns at once (`stopped_reason="already_complete"`); SIGTERM or Ctrl-C during training saves a
    checkpoint and returns `stopped_reason="interrupted"`. `callback` receives every training event (the CLI's
    `run.progress.TrainDisplay`); the configured tracker (train.logger) gets them too. `progress`: show a progress
    bar with the start line and validation losses (`run.progress.notebook_display`); None (the default) shows it in
    a Jupyter notebook when no `callback` is given and stays silent elsewhere, True always, False never."""
    # deferred: torch
    from posenc_cli.run.progress import notebook_display
    from posenc_cli.run.run_dir import default_run_dir
    from posenc_cli.run.trackers import tracked
    from posenc_cli.run.train import train as run_training

    if isinstance(overrides, Config):
        if resume is not None and out is not None and Path(out).resolve() != Path(resume).resolve():
            raise ConfigError("--out and --resume name different directories; give one of them")
        cfg = overrides
    else:
        cfg = train_config(overrides, out=out, resume=resume, config_dir=config_dir)
    where = resume if resume is not None else out
    run_dir = Path(where) if where else default_run_dir(cfg)
    display = None
    if progress or (progress is None and callback is None):
        display = notebook_display(cfg.train.log_every, always=bool(progress))
    with contextlib.ExitStack() as stack:
        if display is not None:
            stack.enter_context(display)
            callback = _both(callback, display)
        with tracked(callback, cfg, run_dir) as events:
            return run_training(cfg, run_dir, resume=resume is not None, force_config=force_config, callback=events)


def _both(first: Event | None, second: Event) -> Event:
    """One callback that calls `first` (when given) then `second` with each event."""
    if first is None:
        return second

    def both(event: dict[str, Any]) -> None:
        first(event)
        second(event)

    return both
