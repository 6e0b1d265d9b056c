"""What `posenc extend` prints: the before/after table of a scaling or a remapping, the LongRoPE search's line, and
`--eval`'s side-by-side table (also `posenc calibrate --eval`'s)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from posenc_cli.api.extension import scaling_method
from posenc_cli.report.tables import extrapolation_table

if TYPE_CHECKING:
    from posenc_cli.api.extension import ExtendOutcome, ExtendResult, RemapResult

__all__ = ["evaluation_table", "remap_table", "search_line", "shown", "summary_table"]


def summary_table(r: ExtendResult) -> Table:
    """Before/after: scaling, attention factor, frequency pairs, longest wavelength, lengths, directories."""
    pairs = r.rotary_dim // 2
    at = " (at s·L tokens; it rescales per sequence length)" if scaling_method(r.method).length_dependent else ""
    title = {
        "created": "extended",
        "finetuned": "extended and fine-tuned",
        "already_complete": "already extended (nothing to do)",
        "interrupted": "extended; fine-tune interrupted",
    }[r.status]
    t = Table(title=f"posenc extend · {title}", title_justify="left", header_style="bold")
    t.add_column("", style="bold")  # wraps too, so a narrow terminal does not squeeze only the values
    plain = r.parent_scaling == "none"
    t.add_column("before (parent)" if plain else "before (plain RoPE; parent scaling replaced)")
    t.add_column("after (child)")
    # Paths fold onto more lines in a narrow terminal instead of being cut to "outputs/sweeps/2…".
    t.add_row("run", Text(shown(r.parent_dir), overflow="fold"), Text(shown(r.out_dir), overflow="fold"))
    t.add_row("scaling", r.parent_scaling, f"{r.method} ×{r.factor:g} (original length L = {r.original_length})")
    logits = f"; logits ×{r.attention_factor**2:.4f}" if r.attention_factor != 1.0 else ""
    t.add_row("attention factor", "1", f"{r.attention_factor:.4f} on cos and sin{logits}")
    t.add_row(
        f"frequency pairs (d = {r.rotary_dim}, base {r.base:g})",
        f"{pairs} keep",
        f"{r.regions['keep']} keep · {r.regions['blend']} blended · {r.regions['interpolate']} interpolated{at}",
    )
    before, after = r.longest_wavelength
    t.add_row("longest wavelength", f"{_tokens(before)} tokens", f"{_tokens(after)} tokens{at}")
    t.add_row("training length", str(r.parent_train_length), str(r.train_length))
    t.add_row("base length (1×)", str(r.base_length), str(r.base_length))
    if r.finetune is not None:
        f = r.finetune
        val = f"val loss {f.val_loss:.4f}" if f.val_loss is not None and math.isfinite(f.val_loss) else "no val loss"
        t.add_row("fine-tune", "", f"step {f.step}/{f.steps} at {r.train_length} tokens · {val}")
    else:
        t.add_row("weights", "", "copied unchanged")
    return t


def remap_table(result: RemapResult) -> Table:
    """Before/after of a Self-Extend / ReRoPE child: positions, largest relative position, query scaling."""
    title = "already remapped (nothing to do)" if result.status == "already_complete" else "positions remapped"
    t = Table(title=f"posenc extend · {title}", title_justify="left", header_style="bold")
    t.add_column("", style="bold")
    t.add_column("before (parent)")
    t.add_column("after (child)")
    t.add_row("run", Text(shown(result.parent_dir), overflow="fold"), Text(shown(result.out_dir), overflow="fold"))
    rope = "RoPE" if result.parent_scaling == "none" else f"RoPE, {result.parent_scaling}"
    t.add_row("positions", rope, f"{rope}, {result.remap.describe()}")
    for n, d in result.largest_distance.items():
        t.add_row(f"largest relative position at {n} tokens", str(n - 1), f"{d:g}")
    if result.logn_length is not None:
        t.add_row("query scaling", "none", f"log-n: max(1, log(i + 1) / log {result.logn_length})")
    t.add_row("training length", str(result.train_length), str(result.train_length))
    t.add_row("weights", "", "copied unchanged")
    return t


def search_line(outcome: ExtendOutcome) -> str:
    """What the LongRoPE search found, what it cost and which tokens it scored (or that the child of this same
    search was already there); rich markup, paths escaped."""
    found, out_dir = outcome.search, outcome.result.out_dir
    if found is None:
        return (
            f"LongRoPE search: not re-run; {escape(shown(out_dir))} already holds the child of this search "
            "(its factors are in its config)"
        )
    assert outcome.factors_file is not None
    n = len(found.history)
    seed_name = min(found.initial, key=found.initial.get)  # type: ignore[arg-type]
    data = found.data
    return (
        f"LongRoPE search: {n} candidates in {found.seconds:.1f} s ({n / max(found.seconds, 1e-9):.2f}/s, "
        f"{found.tokens} tokens each at {found.target_length}, {data['split']} split tokens "
        f"[{data['start']}, {data['end']}), apart from every evaluation); best perplexity {found.ppl:.4g} "
        f"(best seed {seed_name} {found.initial[seed_name]:.4g}); factors in {escape(shown(outcome.factors_file))}"
    )


def shown(path: Path) -> str:
    """`path` relative to the working directory when it lies below it (default outputs are resolved paths)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _tokens(x: float) -> str:
    return f"{x:,.0f}"


def evaluation_table(docs: list[dict[str, Any]]) -> Table:
    """`--eval`: perplexity by length of parent and child, side by side, labelled as compare labels them."""
    return extrapolation_table(docs, label=lambda r: r["label"])
