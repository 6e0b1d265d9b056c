"""Command-line entry point: `posenc` (see `posenc --help`)."""

from __future__ import annotations

import platform
from typing import Annotated

import typer

from posenc_cli import __version__
from posenc_cli.cli.app import app, console, lazy_commands

# (name, module, summary) of every command, in `posenc --help` order: a module is imported only when one of its
# commands runs or shows its help (`app.lazy_commands`); the summary is the first paragraph of the command's help.
lazy_commands(
    [
        (
            "train",
            "posenc_cli.cli.train",
            "Train one model; the run directory holds weights, config, metadata, metrics and the resume state.",
        ),
        (
            "eval-extrapolate",
            "posenc_cli.cli.evaluate",
            "Perplexity at and beyond the training length, per run and length; stored in each run's "
            "eval/extrapolate.json.",
        ),
        (
            "eval-passkey",
            "posenc_cli.cli.evaluate",
            "Passkey retrieval: exact match of a key hidden at each depth of growing prompts; in "
            "RUN/eval/passkey.json.",
        ),
        (
            "eval-tasks",
            "posenc_cli.cli.tasks",
            "RULER-style retrieval and tracking tasks per length × depth; scores stored in RUN/eval/tasks.json.",
        ),
        (
            "eval-algorithmic",
            "posenc_cli.cli.algorithmic",
            "Algorithmic tasks (copy, reverse, addition, ...) per instance length; accuracy stored in "
            "RUN/eval/algorithmic.json.",
        ),
        (
            "extend",
            "posenc_cli.cli.extend",
            "Scale a RoPE checkpoint's frequencies (linear (PI), NTK-aware, dynamic NTK, YaRN, LongRoPE, llama3) "
            "into a new run directory.",
        ),
        (
            "calibrate",
            "posenc_cli.cli.calibrate",
            "Fit a trained run's attention temperature into a new run directory.",
        ),
        (
            "sweep",
            "posenc_cli.cli.sweep",
            "Run a sweep file from configs/sweep/ through Hydra's multirun, then print the comparison table.",
        ),
        (
            "compare",
            "posenc_cli.cli.compare",
            "Comparison table (and plots with --out) from run or sweep directories already on disk.",
        ),
        (
            "schemes",
            "posenc_cli.cli.schemes",
            "List the registered positional schemes: hooks used, learned parameters, whether they read inputs "
            "longer than the training length, reference paper.",
        ),
        (
            "data",
            "posenc_cli.cli.data",
            "Prepare and summarise the token cache. Example: posenc data data=text data.paths=\\[notes/] tokenizer=bpe",
        ),
        (
            "bench",
            "posenc_cli.cli.bench",
            "Measure training throughput (posenc vs transformers' Llama), matmul peak, MFU and long-context "
            "evaluation.",
        ),
        (
            "export",
            "posenc_cli.cli.export",
            "Export a run to transformers: learned runs as GPT-2, RoPE runs as GPT-NeoX (LayerNorm) or SmolLM3 "
            "(RMSNorm).",
        ),
        (
            "viz",
            "posenc_cli.cli.viz",
            "Pictures of encodings (from the schemes' own hooks) and of trained models' attention.",
        ),
    ]
)


def _version(value: bool) -> None:
    if not value:
        return
    import torch  # here, not at the top: the root group serves `posenc --help`, which loads no torch

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
