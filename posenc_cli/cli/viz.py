"""`posenc viz encoding|attention|compare`: pictures of positional encodings and of what trained models attend to."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from posenc_cli import api
from posenc_cli.cli.app import ConfigDirOption, app, console, handles_errors, path_exists, split_args
from posenc_cli.errors import ConfigError

viz_app = typer.Typer(
    name="viz",
    help="Pictures of encodings (from the schemes' own hooks) and of trained models' attention.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    epilog="Example: posenc viz encoding pos=rope   |   posenc viz attention outputs/runs/rope",
)
app.add_typer(viz_app, name="viz")

DEFAULT_DIR = Path("outputs/viz")  # as api.viz.DEFAULT_DIR, named in the help before the API loads


def out_option(default: str) -> Any:
    """`--out PNG` whose help names where the figure goes without it."""
    return typer.Option("--out", metavar="PNG", help=f"Figure file (default: {default}).", show_default=False)


DeviceOption = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or mps.")]
WindowsOption = Annotated[int, typer.Option("--windows", min=1, help="Held-out validation windows per length.")]

_ENCODING_EXAMPLES = """
[bold]Examples[/]

  posenc viz encoding pos=sinusoidal
  posenc viz encoding pos=alibi model=small --out alibi.png
  posenc viz encoding pos=rope --length 512
  posenc viz encoding outputs/runs/learned   [dim](the trained scheme of a run)[/]
"""

_ATTENTION_EXAMPLES = """
[bold]Examples[/]

  posenc viz attention outputs/runs/rope
  posenc viz attention outputs/runs/alibi --layer 0 --head all --length 1024 --out alibi-attn.png
"""

_COMPARE_EXAMPLES = """
[bold]Examples[/]

  posenc viz compare outputs/runs/rope outputs/runs/alibi --multiple 8
  posenc viz compare outputs/sweeps/*-extrapolation --out attention.png   [dim](every run of a sweep)[/]
"""


@viz_app.command(
    "encoding", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, epilog=_ENCODING_EXAMPLES
)
@handles_errors
def encoding_command(
    args: Annotated[
        list[str] | None,
        typer.Argument(
            help="Config overrides (pos=alibi model=small ...), or one run directory to draw its trained scheme.",
            metavar="[OVERRIDES | RUN_DIR]",
            show_default=False,
        ),
    ] = None,
    out: Annotated[Path | None, out_option(f"{DEFAULT_DIR}/encoding-<scheme>.png")] = None,
    length: Annotated[
        int | None, typer.Option("--length", metavar="N", help="Positions drawn (default: the training length).")
    ] = None,
    head: Annotated[int, typer.Option("--head", metavar="H", help="Head of the rotation and (i, j) bias panels.")] = 0,
    layer: Annotated[
        int | None,
        typer.Option(
            "--layer",
            metavar="K",
            help="Layer whose bias is drawn (default 0; a per-layer layout: every layer's scheme, or only layer K's).",
        ),
    ] = None,
    config_dir: ConfigDirOption = None,
) -> None:
    """Draw what a scheme's hooks do: added embeddings, rotation angles, or score biases (also a grid here)."""
    # Sweep job directories are named like `pos=rope`: an existing path is a run directory, not an override.
    paths = [a for a in args or [] if path_exists(a)]
    names, overrides = split_args([a for a in args or [] if a not in paths])
    names = paths + names
    if len(names) > 1:
        raise ConfigError(f"give at most one run directory, got {len(names)}: {' '.join(names)}")
    picture = api.viz_encoding(
        overrides,
        names[0] if names else None,
        out=out,
        length=length,
        head=head,
        layer=layer,
        config_dir=config_dir,
    )
    for grid in picture.grids:
        console.print(grid)
    console.print(f"wrote {escape(str(picture.path))}", highlight=False)


@viz_app.command("attention", epilog=_ATTENTION_EXAMPLES)
@handles_errors
def attention_command(
    run_dir: Annotated[Path, typer.Argument(help="A trained run directory.", show_default=False)],
    length: Annotated[
        int | None,
        typer.Option("--length", metavar="L", help="The longer length (default 4 × the training length)."),
    ] = None,
    layer: Annotated[str, typer.Option("--layer", metavar="K|all", help="Layer(s) of the maps.")] = "all",
    head: Annotated[
        str, typer.Option("--head", metavar="H|all|mean", help="Head(s) of the maps; mean averages the heads.")
    ] = "mean",
    windows: WindowsOption = 4,
    out: Annotated[Path | None, out_option("RUN_DIR/viz/attention.png")] = None,
    device: DeviceOption = "auto",
) -> None:
    """Attention maps at the training length and a longer one, side by side, and attention mass by distance."""
    report, path = api.viz_attention(
        run_dir, length=length, layer=layer, head=head, windows=windows, out=out, device=device
    )
    table = Table(title=f"Mean attended distance (tokens) · {escape(report.run)} · trained at {report.train_length}")
    table.add_column("layer", justify="right")
    if report.layer_notes:  # a per-layer layout: each layer's scheme, span and temperature
        table.add_column("attends with")
    for panel in report.panels:
        table.add_column(f"L = {panel.length} ({panel.multiple:g}×)", justify="right")
    distances = [p.mean_distance() if p.status == "ok" else None for p in report.panels]
    for k in range(report.n_layer):
        notes = [escape(report.layer_notes[k])] if report.layer_notes else []
        table.add_row(str(k), *notes, *("n/a" if d is None else f"{d[k]:.1f}" for d in distances))
    console.print(table)
    console.print(f"wrote {escape(str(path))}", highlight=False)


@viz_app.command("compare", epilog=_COMPARE_EXAMPLES)
@handles_errors
def compare_command(
    paths: Annotated[
        list[Path], typer.Argument(help="Run directories or sweep directories (searched for runs).", show_default=False)
    ],
    multiple: Annotated[float, typer.Option("--multiple", help="Longer length as a multiple of each run's.")] = 4.0,
    windows: WindowsOption = 4,
    out: Annotated[Path | None, out_option(f"{DEFAULT_DIR}/attention-compare.png")] = None,
    device: DeviceOption = "auto",
) -> None:
    """One small panel per run: attention mass by distance at 1× and at --multiple × the training length."""
    path = api.viz_compare(paths, multiple=multiple, windows=windows, out=out, device=device)
    console.print(f"wrote {escape(str(path))}", highlight=False)
