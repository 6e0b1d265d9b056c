"""`posenc schemes`: the registered positional schemes, one row each (new scheme files appear automatically)."""

from __future__ import annotations

from rich.table import Table

from posenc_cli.cli.app import app, console, handles_errors

LONGER_INPUTS_NOTE = (
    "reads longer inputs: the model runs on sequences longer than it was trained on (learned positions cannot: their "
    "table ends). It says nothing about quality there: `posenc eval-extrapolate` measures that, and most schemes "
    "degrade."
)


def scheme_rows() -> list[dict[str, str]]:
    """One dict per registered scheme: name, hooks, learned parameters, extrapolates (= can read inputs longer than
    the training length, not that quality holds there), paper."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.config import ModelConfig
    from posenc_cli.positional import registry
    from posenc_cli.positional.layout import is_layout

    rows = []
    for name, cls in registry().items():
        hooks, extrapolates, learned = ", ".join(cls.hooks) or "none", cls.extrapolates, "?"
        try:  # instantiate at the default sizes (a layout: deep enough for its pattern) to read what it has
            cfg = cls.config_cls(name=name)
            model = ModelConfig(n_layer=max(ModelConfig().n_layer, len(getattr(cfg, "layers", ()))))
            scheme = cls(cfg, model, 128)
            learned = "yes" if any(True for _ in scheme.parameters()) else "no"
            hooks, extrapolates = ", ".join(scheme.hooks) or "none", scheme.extrapolates  # a layout's: its layers'
            if is_layout(scheme):  # "per layer (rope, nope): rotate"
                names = dict.fromkeys(line.split(",")[0] for line in scheme.describe_layers())
                hooks = f"per layer ({', '.join(names)}): {hooks}"
        except Exception:
            pass
        rows.append(
            {
                "name": name,
                "hooks": hooks,
                "learned": learned,
                "extrapolates": "yes" if extrapolates else "no",
                "paper": cls.paper,
            }
        )
    return rows


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
    for row in scheme_rows():
        table.add_row(row["name"], row["hooks"], row["learned"], row["extrapolates"], row["paper"])
    console.print(table)
