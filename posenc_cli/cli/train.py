"""`posenc train`: compose a config from overrides, train into a run directory, resume it when it exists."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from posenc_cli.cli.app import ConfigDirOption, app, console, err_console, handles_errors, stdout_is_terminal
from posenc_cli.config import Config, config_to_dict, config_to_yaml
from posenc_cli.errors import ConfigError
from posenc_cli.run.config_load import config_from_dict


@app.command(
    "train",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    epilog="Example: posenc train pos=alibi model=tiny train.steps=600 --out outputs/runs/alibi",
)
@handles_errors
def train_command(
    args: Annotated[list[str] | None, typer.Argument(help="Overrides, e.g. pos=alibi train.steps=600.")] = None,
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            metavar="DIR",
            help="Run directory (default outputs/runs/<time>-<pos>-<model>). An existing run there is continued.",
        ),
    ] = None,
    resume: Annotated[
        str | None,
        typer.Option("--resume", metavar="DIR", help="Continue the run in DIR with its saved config."),
    ] = None,
    force_config: Annotated[
        bool, typer.Option("--force-config", help="Continue an existing run even though the config changed.")
    ] = False,
    cfg_mode: Annotated[
        str | None, typer.Option("--cfg", metavar="job", help="Print the resolved config and exit ('job').")
    ] = None,
    config_dir: ConfigDirOption = None,
) -> None:
    """Train one model; the run directory holds weights, config, metadata, metrics and the resume state.

    SIGTERM or Ctrl-C finishes the current step (with train.grad_accum > 1: the current micro-batch, and the step
    is redone on resume), saves a checkpoint and exits with 128+signal; the same command (or --resume DIR) then
    continues exactly where it stopped. A config that cannot run here (memory, a step that could never finish) is
    refused before anything is allocated or written. A finished run is left alone (exit 0).
    """
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.cli.app import split_args
    from posenc_cli.sweep.hydra_bridge import compose_config

    names, overrides = split_args(args)
    if names:
        raise ConfigError(f"unexpected argument '{names[0]}' (overrides look like key=value)")
    if cfg_mode is not None and cfg_mode != "job":
        raise ConfigError(f"--cfg {cfg_mode} is not supported (use --cfg job)")
    if resume is not None:
        run_dir = Path(resume)
        if out is not None and Path(out).resolve() != run_dir.resolve():
            raise ConfigError("--out and --resume name different directories; give one of them")
        cfg = resumed_config(run_dir, overrides)
    else:
        cfg = compose_config(overrides, Path(config_dir) if config_dir else None)
    if cfg_mode == "job":
        console.print(config_to_yaml(cfg), end="", highlight=False, markup=False)
        return
    run(cfg, resume, out, force_config)


def resumed_config(run_dir: Path, overrides: list[str]) -> Config:
    """The config saved in `run_dir`, with dotted overrides (train.steps=800) applied on top."""
    # deferred: keeps OmegaConf (Hydra's) and this command's modules off posenc --help start-up
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from posenc_cli.run.load import read_config
    from posenc_cli.run.meta import read_meta

    for o in overrides:
        key = o.split("=", 1)[0]
        if key.startswith(("+", "~")) or "." not in key:
            raise ConfigError(f"with --resume, overrides must set single keys such as train.steps=800 (got '{o}')")
    cfg = read_config(run_dir, read_meta(run_dir))
    if not overrides:
        return cfg
    try:
        merged = OmegaConf.merge(OmegaConf.create(config_to_dict(cfg)), OmegaConf.from_dotlist(overrides))
        raw = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError(str(e).splitlines()[0]) from e
    assert isinstance(raw, dict)
    return config_from_dict(raw)  # type: ignore[arg-type]


def run(cfg: Config, resume: str | None, out: str | None, force_config: bool) -> None:
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.cpu_load import training_busy_warning
    from posenc_cli.run.distributed import env_info
    from posenc_cli.run.progress import TrainDisplay, interrupted_message, summary_table
    from posenc_cli.run.run_dir import default_run_dir
    from posenc_cli.run.trackers import tracked
    from posenc_cli.run.train import check_budget, train

    run_dir = Path(resume or out) if (resume or out) else default_run_dir(cfg)
    check_budget(cfg)  # a config that cannot run is refused before the busy-machine advice (train checks it too)
    if (busy := training_busy_warning(cfg.train.device, cfg.train.threads)) and env_info().is_main:
        err_console.print(f"[yellow]warning:[/] {escape(busy)}", highlight=False)
    display = TrainDisplay(console, live=stdout_is_terminal(), log_every=cfg.train.log_every)
    with display, tracked(display, cfg, run_dir) as callback:
        result = train(cfg, run_dir, resume=resume is not None, force_config=force_config, callback=callback)
    if not env_info().is_main:  # under torchrun only rank 0 reports, like it alone writes
        if result.stopped_reason == "interrupted":
            raise typer.Exit(128 + (result.signal or 2))
        return
    if result.stopped_reason == "already_complete":
        console.print(
            f"{escape(str(run_dir))} is already complete (step {result.step}/{result.steps}); nothing to do.",
            highlight=False,
        )
        return
    if result.stopped_reason == "interrupted":
        err_console.print(f"[yellow]{escape(interrupted_message(result))}[/]", highlight=False)
        raise typer.Exit(128 + (result.signal or 2))
    console.print(summary_table(result))
