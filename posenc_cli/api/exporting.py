"""`posenc export` as a function: write a run as a `transformers` model directory (`run.export.export_run`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from posenc_cli.run.export import ExportResult

__all__ = ["export"]


def export(run: str | Path, out: str | Path, *, to: str = "hf", verify: bool = True) -> ExportResult:
    """Write run `run` into `out` (which must not exist or be empty) as a `transformers` model directory that
    `AutoModelForCausalLM.from_pretrained(out)` loads with no remote code: learned runs as GPT-2, LayerNorm RoPE
    runs (plain or extended) as GPT-NeoX, RMSNorm RoPE runs and per-layer layouts of RoPE and NoPE layers as SmolLM3;
    other schemes and settings are refused (`NotExportable`, a `UserError`) before anything is written. `verify`:
    reload the export and compare its logits with posenc's (`ExportResult.max_abs_diff`) before it is moved into
    place. Prints nothing (transformers' own progress bars and advice are the caller's to silence)."""
    # deferred: torch and transformers
    from posenc_cli.run.export import export_run

    return export_run(run, out, to=to, verify=verify)
