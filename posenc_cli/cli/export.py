"""`posenc export`: write a run as a `transformers` model directory (`api.export`): GPT-2 for learned runs, GPT-NeoX
for LayerNorm RoPE runs, SmolLM3 for RMSNorm RoPE runs and per-layer layouts of RoPE and NoPE layers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from posenc_cli import api
from posenc_cli.cli.app import app, console, handles_errors

_EPILOG = (
    "Examples:  posenc export outputs/runs/rope --to hf --out exported/rope   "
    "|   posenc export outputs/runs/rope-yarnx4 --out exported/rope-yarn   "
    "|   then in Python: AutoModelForCausalLM.from_pretrained('exported/rope')"
)


@app.command("export", epilog=_EPILOG)
@handles_errors
def export_command(
    run_dir: Annotated[Path, typer.Argument(help="The run directory to export (never modified).")],
    out: Annotated[
        Path, typer.Option("--out", metavar="DIR", help="New directory for the model (must not exist or be empty).")
    ],
    to: Annotated[str, typer.Option("--to", metavar="FORMAT", help="Target format: hf (transformers).")] = "hf",
    verify: Annotated[
        bool,
        typer.Option(
            "--verify/--no-verify", help="Reload the export with transformers and compare its logits with posenc's."
        ),
    ] = True,
) -> None:
    """Export a run to transformers: learned runs as GPT-2, RoPE runs as GPT-NeoX (LayerNorm) or SmolLM3 (RMSNorm).

    RoPE runs are plain or extended; those with model.norm=rmsnorm, and per-layer layouts of RoPE and NoPE layers
    with full or sliding-window attention (pos=smollm3, rnope-swa, layout), export as SmolLM3. The directory holds
    config.json, model.safetensors and a tokenizer, and loads with AutoModelForCausalLM.from_pretrained(DIR) and
    AutoTokenizer.from_pretrained(DIR), no remote code; --verify (the default) compares its logits with posenc's
    before it is moved into place. Other schemes and settings with no exact transformers counterpart (chunked
    attention, query temperatures, p-RoPE, position remaps, attention-logit scaling, positions dropped) are refused
    before anything is written (exit 2).
    """
    quiet_transformers()
    r = api.export(run_dir, out, to=to, verify=verify)
    rope = f", rope {r.rope_type}" if r.rope_type else ""
    if r.rope_scaling:
        original = r.rope_scaling.get("original_max_position_embeddings")
        rope += f" ×{r.rope_scaling['factor']:g}" + (f" of L={original}" if original else "")
    limit = f", up to {r.max_length} positions" if r.max_length else ""
    console.print(
        f"exported {escape(str(r.run_dir))} ({r.scheme}, step {r.step}) -> {escape(str(r.out_dir))} as "
        f"{r.architecture}{rope}{limit}; tokenizer: {r.tokenizer}",
        highlight=False,
    )
    if r.max_abs_diff is not None:
        console.print(
            f"verified: max |Δlogit| {r.max_abs_diff:.2e} vs posenc on {r.verify_tokens} random tokens", highlight=False
        )
    console.print(
        f"load it: AutoModelForCausalLM.from_pretrained({str(r.out_dir)!r}), AutoTokenizer.from_pretrained(...)",
        highlight=False,
        markup=False,
    )


def quiet_transformers() -> None:
    """No progress bars or advisory warnings from transformers while exporting (errors still raise)."""
    try:
        # deferred: keeps transformers and this command's modules off posenc --help start-up
        from transformers.utils import logging as hf_logging
    except ImportError:  # export_run raises the clear error
        return
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
