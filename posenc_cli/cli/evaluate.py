"""`posenc eval-extrapolate`: not implemented yet."""

from __future__ import annotations

from typing import Annotated

import typer

from posenc_cli.cli.app import app, not_available


@app.command("eval-extrapolate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def eval_extrapolate_command(
    args: Annotated[list[str] | None, typer.Argument(help="Paths and overrides.")] = None,
) -> None:
    """Perplexity at and beyond the training length. Not available yet."""
    not_available("eval-extrapolate", "posenc eval-extrapolate")


@app.command("eval-passkey", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def eval_passkey_command(args: Annotated[list[str] | None, typer.Argument(help="Run directories.")] = None) -> None:
    """Passkey retrieval at growing lengths. Not available yet."""
    not_available("eval-passkey", "new schemes and passkey retrieval")
