"""`posenc schemes`: not implemented yet."""

from __future__ import annotations

from typing import Annotated

import typer

from posenc_cli.cli.app import app, not_available


@app.command("schemes", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def schemes_command(args: Annotated[list[str] | None, typer.Argument(help="Paths and overrides.")] = None) -> None:
    """List the registered positional schemes. Not available yet."""
    not_available("schemes", "model and core schemes")
