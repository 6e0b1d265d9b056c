"""`posenc sweep`: not implemented yet."""

from __future__ import annotations

from typing import Annotated

import typer

from posenc_cli.cli.app import app, not_available


@app.command("sweep", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sweep_command(args: Annotated[list[str] | None, typer.Argument(help="Paths and overrides.")] = None) -> None:
    """Config-driven sweeps. Not available yet."""
    not_available("sweep", "sweeps and comparison tables")


@app.command("compare", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def compare_command(args: Annotated[list[str] | None, typer.Argument(help="Run or sweep directories.")] = None) -> None:
    """Comparison table and plots from directories on disk. Not available yet."""
    not_available("compare", "sweeps and comparison tables")
