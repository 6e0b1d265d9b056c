"""`posenc extend` as a function: `extend` plans the request (`extension.plan.plan_extension`: scale, remap, or
search then scale) and carries it out (`extension.plan.execute`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posenc_cli.extension.longrope_search import Progress
    from posenc_cli.extension.plan import ExtendOutcome

__all__ = ["extend"]


def extend(
    run: str | Path,
    out: str | Path | None = None,
    *,
    callback: Callable[[dict[str, Any]], None] | None = None,
    progress: Progress | None = None,
    **request: Any,
) -> ExtendOutcome:
    """Extend RoPE run `run` into `out` (default: named after the method, beside the run), as `posenc extend` does
    with the same settings: `request` holds `extension.plan.ExtendRequest`'s fields (method, factor, params,
    finetune_steps, ..., factors, search, window, group, leaky, logn, threads; their defaults are the command's).
    `callback` receives a fine-tune's training events, `progress(done, budget, best_ppl)` a LongRoPE search's.
    Idempotent: a child already there is returned as is. The outcome holds the child's result (`ExtendResult`, or
    `RemapResult` for a remapping), and a search run now with the factors file it wrote."""
    # deferred: torch
    from posenc_cli.extension.plan import ExtendRequest, execute, plan_extension

    req = ExtendRequest(run=Path(run), out=Path(out) if out is not None else None, **request)
    return execute(plan_extension(req), callback=callback, progress=progress)
