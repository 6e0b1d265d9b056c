"""`posenc train`: compose a config from overrides, train into a run directory, resume it when it exists."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from posenc_cli import api
from posenc_cli.cli.app import ConfigDirOption, app, console, err_console, handles_errors, stdout_is_terminal
from posenc_cli.config import Config, config_to_yaml
from posenc_cli.errors import ConfigError


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

    names, overrides = split_args(args)
    if names:
        raise ConfigError(f"unexpected argument '{names[0]}' (overrides look like key=value)")
    if cfg_mode is not None and cfg_mode != "job":
        raise ConfigError(f"--cfg {cfg_mode} is not supported (use --cfg job)")
    cfg = api.train_config(overrides, out=out, resume=resume, config_dir=config_dir)
    if cfg_mode == "job":
        console.print(config_to_yaml(cfg), end="", highlight=False, markup=False)
        return
    run(cfg, resume, out, force_config)


def run(cfg: Config, resume: str | None, out: str | None, force_config: bool) -> None:
    """Train `cfg` through the API under the progress display, then say how it ended."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.run.progress import TrainDisplay, interrupted_message, summary_table

    if busy := api.train_warning(cfg):  # a config that cannot run is refused before the busy-machine advice
        err_console.print(f"[yellow]warning:[/] {escape(busy)}", highlight=False)
    display = TrainDisplay(console, live=stdout_is_terminal(), log_every=cfg.train.log_every)
    with display:
        result = api.train(cfg, out, resume=resume, force_config=force_config, callback=display)
    if not api.is_main_process():  # under torchrun only rank 0 reports, like it alone writes
        if result.stopped_reason == "interrupted":
            raise typer.Exit(128 + (result.signal or 2))
        return
    if result.stopped_reason == "already_complete":
        console.print(
            f"{escape(str(result.run_dir))} is already complete (step {result.step}/{result.steps}); nothing to do.",
            highlight=False,
        )
        return
    if result.stopped_reason == "interrupted":
        err_console.print(f"[yellow]{escape(interrupted_message(result))}[/]", highlight=False)
        raise typer.Exit(128 + (result.signal or 2))
    console.print(summary_table(result))
