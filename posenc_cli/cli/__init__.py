"""Command-line entry point: `posenc` (see `posenc --help`)."""

from __future__ import annotations

import importlib
import platform
from typing import Annotated

import typer

from posenc_cli import __version__
from posenc_cli.cli.app import app, console

# Each module registers its commands on `app`; the order here is the order in `posenc --help`.
_COMMAND_MODULES = (
    "train",
    "evaluate",
    "tasks",
    "algorithmic",
    "extend",
    "calibrate",
    "sweep",
    "compare",
    "schemes",
    "data",
    "bench",
    "export",
    "viz",
)
for _name in _COMMAND_MODULES:
    importlib.import_module(f"posenc_cli.cli.{_name}")


def _version(value: bool) -> None:
    if not value:
        return
    # deferred: keeps this command's modules off posenc --help start-up
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        device += f" ({torch.cuda.get_device_name(0)})"
    console.print(
        f"posenc {__version__} | torch {torch.__version__} | Python {platform.python_version()} | device: {device}",
        highlight=False,
    )
    raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print versions and exit.")
    ] = False,
) -> None:
    """posenc: train short, test long."""


def main() -> None:
    app(prog_name="posenc")  # also under `python -m posenc_cli`, so completion and usage lines name posenc


__all__ = ["app", "main"]
