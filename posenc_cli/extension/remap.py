"""Position remapping of a RoPE run (Self-Extend, ReRoPE; `posenc extend --method self-extend|rerope`, a sweep's
`extend.remap`): no new frequencies and no training, only `pos.remap` (and, as the method's reference does, log-n
query scaling) in the child, whose weights are the parent's byte for byte. The maths: `posenc_cli.positional.remap`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from posenc_cli import __version__
from posenc_cli.config import REMAP_METHODS, RemapConfig, replace
from posenc_cli.errors import ConfigError
from posenc_cli.extension.child_run import (
    check_out_dir,
    describe_scaling,
    is_complete,
    write_scaled_copy,
    writer_lock,
)
from posenc_cli.extension.rope_layers import describe_entries, rope_entries, selected_settings, with_rope_options
from posenc_cli.extension.settings import check_parent, remap_logn_default
from posenc_cli.positional.remap import remapped_distance
from posenc_cli.run.device import threads as use_threads
from posenc_cli.run.drope import refuse_dropped
from posenc_cli.run.layout import MODEL_FILE
from posenc_cli.run.load import load_run
from posenc_cli.run.run_dir import claim_run_dir

__all__ = ["RemapResult", "remap_run"]


@dataclasses.dataclass
class RemapResult:
    """What `remap_run` did: the directories, the remapping, and the largest relative position at a few lengths."""

    parent_dir: Path
    out_dir: Path
    status: str  # "created" or "already_complete"
    remap: RemapConfig
    parent_scaling: str
    train_length: int
    base_length: int
    largest_distance: dict[int, float]  # tokens -> the largest relative position the model sees at that length
    logn_length: int | None = None  # L of the log-n query scaling the child adds (None: none added)


def remap_run(
    parent_dir: Path | str,
    out_dir: Path | str,
    remap: RemapConfig,
    *,
    threads: int = 0,
    logn: bool | None = None,
    layers: str = "global",
) -> RemapResult:
    """Write the child of RoPE run `parent_dir` that remaps positions as `remap` says (its config's `pos.remap`;
    weights, tokenizer and everything else the parent's), with log-n query scaling (`model.attn_scale=logn`,
    L = the parent's training length) when `logn`, by default as the method's reference (`remap_logn_default`).
    Idempotent like `extend_run`. Refused with a one-line `UserError` before anything is written: bad settings, a
    transformers directory, a parent that is not RoPE or already remaps, `logn` asked of a parent that already
    scales its logits, an `out_dir` that is the parent or holds anything else."""
    if remap.method == "none":
        raise ConfigError(f"give a remapping method: {' or '.join(REMAP_METHODS)}")
    remap.validate()
    parent_path, out = Path(parent_dir), Path(out_dir)
    check_parent(parent_path, out, remap=remap.method)
    with use_threads(threads):
        parent = load_run(parent_path)
    refuse_dropped(parent_path, parent.positions_dropped_at, "there are no RoPE positions to remap")
    cfg = parent.config
    entries = rope_entries(cfg, layers, parent_path, f"{remap.method} (a RoPE remapping)")  # [] for a plain RoPE run
    for rope in selected_settings(cfg, entries):
        if rope.remap.active:
            raise ConfigError(f"{parent_path} already remaps positions ({rope.remap.describe()})")
    if logn and cfg.model.attn_scale != "none":
        raise ConfigError(f"{parent_path} already scales attention logits (model.attn_scale={cfg.model.attn_scale})")
    parent_length, base_length = parent.meta.lengths(cfg)
    # by default as the reference; a parent that already scales its logits keeps its own scaling (config shows it)
    add_logn = logn if logn is not None else remap_logn_default(remap.method) and cfg.model.attn_scale == "none"
    record: dict[str, Any] = {
        "method": remap.method,
        "scaling": None,
        "remap": dataclasses.asdict(remap),
        "finetune": None,
        "parent_weights_sha256": str(parent.meta.files[MODEL_FILE]),
        "parent_train_length": parent_length,
        "posenc_version": __version__,
    }
    if (chosen := describe_entries(cfg, entries, layers)) is not None:  # a layout's remapped layers
        record["layers"] = chosen
    model = cfg.model
    if add_logn:
        record["logn"] = {"length": parent_length}
        model = replace(model, attn_scale="logn", logn_length=parent_length)
    child_cfg = replace(cfg, model=model, pos=with_rope_options(cfg.pos, entries, remap=remap))
    lengths = [m * parent_length for m in (1, 4, 16)]
    result = RemapResult(
        parent_dir=parent_path,
        out_dir=out,
        status="created",
        remap=remap,
        parent_scaling=describe_scaling(getattr(cfg.pos, "scaling", None)),
        train_length=parent_length,
        base_length=base_length,
        largest_distance={n: remapped_distance(remap, n - 1, 0) for n in lengths},
        logn_length=parent_length if add_logn else None,
    )
    check_out_dir(out, record, resume=False)
    with writer_lock(out):
        existing = check_out_dir(out, record, resume=False)
        if existing is not None and is_complete(out, existing):
            result.status = "already_complete"
            return result
        if existing is None:
            claim_run_dir(out)
        extra = {"parent": str(parent_path.resolve()), "base_length": base_length, "extend": record}
        write_scaled_copy(parent, out, child_cfg, extra, parent_length)
        return result
