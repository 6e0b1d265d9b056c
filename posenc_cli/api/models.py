"""A run's model in Python: `load_model` reads a run directory back (weights, config, metadata, tokenizer)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from posenc_cli.run.load import LoadedRun

__all__ = ["load_model"]


def load_model(run: str | Path, device: str = "cpu", *, complete_only: bool = True) -> LoadedRun:
    """The model of run directory `run` on `device` ("auto": the best one here), every file verified
    (`run.load.load_run`): `.model` (a `torch.nn.Module` in eval mode), `.config`, `.meta`, `.tokenizer`, `.path`.
    A run that did not finish training is refused unless `complete_only=False` (its numbers would be labelled as
    the run's); a missing, truncated or tampered file raises `CheckpointError` naming it."""
    # deferred: torch
    from posenc_cli.run.device import resolve_device
    from posenc_cli.run.load import load_run

    return load_run(run, device=resolve_device(device, "device"), complete_only=complete_only)
