"""`posenc data`: not implemented yet."""

from __future__ import annotations

from typing import Annotated

import typer

from posenc_cli.cli.app import app, not_available


@app.command("data", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def data_command(args: Annotated[list[str] | None, typer.Argument(help="Paths and overrides.")] = None) -> None:
    """Prepare and summarise the token cache. Not available yet."""
    not_available("data", "foundation data pipeline")
