"""`posenc schemes`: the registered positional schemes, one row each (new scheme files appear automatically)."""

from __future__ import annotations

from rich.table import Table

from posenc_cli import api
from posenc_cli.cli.app import app, console, handles_errors

LONGER_INPUTS_NOTE = (
    "reads longer inputs: the model runs on sequences longer than it was trained on (learned positions cannot: their "
    "table ends). It says nothing about quality there: `posenc eval-extrapolate` measures that, and most schemes "
    "degrade."
)


@app.command(
    "schemes",
    epilog="Example: posenc schemes   then train one of them: posenc train pos=kerple pos.variant=power",
)
@handles_errors
def schemes_command() -> None:
    """List the registered positional schemes: hooks used, learned parameters, whether they read inputs longer than
    the training length, reference paper."""
    table = Table(
        title="Positional schemes (select with pos=<name>)",
        caption=LONGER_INPUTS_NOTE,
        caption_justify="left",
    )
    table.add_column("name", style="bold cyan", no_wrap=True)
    table.add_column("hooks")
    table.add_column("learned")
    table.add_column("reads longer inputs")
    table.add_column("paper", overflow="fold")
    for row in api.schemes():
        table.add_row(row["name"], row["hooks"], row["learned"], row["extrapolates"], row["paper"])
    console.print(table)
