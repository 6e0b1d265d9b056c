"""`posenc train`: not implemented yet."""

from __future__ import annotations

from typing import Annotated

import typer

from posenc_cli.cli.app import app, not_available


@app.command("train", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train_command(args: Annotated[list[str] | None, typer.Argument(help="Paths and overrides.")] = None) -> None:
    """Train one model. Not available yet."""
    not_available("train", "posenc train")
