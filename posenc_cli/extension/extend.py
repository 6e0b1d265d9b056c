"""RoPE context extension of a checkpoint (`posenc extend`): frequency scaling plus an optional short fine-tune.

`extend_run` never modifies the source run. It writes a new run directory whose `config.yaml` records the scaling
under `pos.scaling` (method, factor, original length L and the method's parameters, all explicit), so `load_run` of
it builds the scaled model and `posenc eval-extrapolate` works on it unchanged. Without fine-tuning the weights file
is copied byte for byte (its sha256 stays the parent's); with `finetune_steps > 0` the scaled model is trained
further at L' (default factor·L) by `train.train`, which brings progress events, checkpoints and resume.

Metadata: `parent` = the parent run's absolute path, `base_length` = the parent's (the root run's training length),
`train_length` = the parent's (no fine-tune) or L', and `extend` = the settings record that makes a re-run
idempotent. Maths and defaults: `posenc_cli/rope_scaling/` (one file per method) and
../shared/reference/rope-scaling.md. YaRN's attention factor multiplies both cos and sin (logits scale by its
square), as in `transformers`. `dynamic` rescales per sequence length at run time (plain RoPE up to L), also while
fine-tuning at L'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posenc_cli import __version__
from posenc_cli.config import Config, ExtendConfig, replace
from posenc_cli.errors import ConfigError
from posenc_cli.extension.child_run import (
    check_out_dir,
    describe_scaling,
    is_complete,
    write_scaled_copy,
    writer_lock,
)
from posenc_cli.extension.hf_extend import extend_hf_dir
from posenc_cli.extension.limits import frequency_numbers
from posenc_cli.extension.rope_layers import (
    describe_entries,
    rope_entries,
    rope_settings,
    selected_settings,
    with_rope_options,
)
from posenc_cli.extension.settings import check_parent, finetune_length, validate_extend
from posenc_cli.positional.fope import FopeConfig
from posenc_cli.positional.rope import rotary_dim
from posenc_cli.rope_scaling import RopeScalingConfig
from posenc_cli.run.device import threads as use_threads
from posenc_cli.run.drope import refuse_dropped
from posenc_cli.run.layout import MODEL_FILE
from posenc_cli.run.load import load_run
from posenc_cli.run.meta import RunMeta
from posenc_cli.run.outcome import ExtendResult
from posenc_cli.run.run_dir import claim_run_dir
from posenc_cli.run.train import train

__all__ = [
    "child_config",
    "extend_run",
    "extension_record",
    "parent_train_length",
    "require_rope",
    "resolve_scaling",
]

# ----------------------------------------------------------------------------------------------------------------
# Pure pieces.


def require_rope(cfg: Config, run_dir: Path | str) -> None:
    """Frequency scaling of a whole run applies to plain RoPE checkpoints only: one line otherwise (a layout's
    RoPE layers: `rope_layers.rope_entries`)."""
    if cfg.pos.name != "rope":
        raise ConfigError(
            f"{run_dir} uses pos={cfg.pos.name}; frequency scaling (extend) applies only to RoPE checkpoints"
        )


def parent_train_length(cfg: Config, meta: RunMeta) -> int:
    """The checkpoint's training length (meta `train_length`; a fine-tuned child's is its L')."""
    return meta.lengths(cfg)[0]


def resolve_scaling(ext: ExtendConfig, parent_cfg: Config, parent_meta: RunMeta) -> RopeScalingConfig:
    """The child's `pos.scaling`: L = --original-length or the checkpoint's training length, always explicit.

    Explicit because a fine-tuned child trains at L' (its `train.seq_len`), and RoPE would otherwise take L' as L.
    """
    return RopeScalingConfig(
        method=ext.method,
        factor=float(ext.factor),
        original_length=ext.original_length or parent_train_length(parent_cfg, parent_meta),
        params=ext.params,
    )


def child_config(
    parent_cfg: Config,
    scaling: RopeScalingConfig,
    ext: ExtendConfig,
    threads: int = 0,
    entries: list[int] | None = None,
) -> Config:
    """The parent's config with `pos.scaling` set (a layout's: on its `entries`, `rope_layers.rope_entries`); with a
    fine-tune, `train` becomes the short run at L'.

    `threads` (the fine-tune's `train.threads`) is a runtime setting; without a fine-tune `train` is the parent's.
    Same data, tokenizer, batch size, precision and seed; steps = N, lr = finetune_lr, warm-up = finetune_warmup
    (the YaRN recipe scaled down: a short warm-up and a small learning rate). With `ext.pose` (PoSE) the fine-tune
    windows keep the original length L and their position ids skip-wise span L' (`train.pose_length`).
    """
    pos = with_rope_options(parent_cfg.pos, entries or [], scaling=scaling)
    train = parent_cfg.train
    if ext.finetune_steps > 0:
        assert scaling.original_length is not None
        target = finetune_length(ext, scaling.original_length)
        train = replace(
            train,
            threads=threads,
            seq_len=scaling.original_length if ext.pose else target,
            steps=ext.finetune_steps,
            lr=ext.finetune_lr,
            warmup_steps=min(ext.finetune_warmup, ext.finetune_steps),
            random_positions=0,
            pose_length=target if ext.pose else 0,
            pose_chunks=ext.pose_chunks if ext.pose else train.pose_chunks,
        )
    model = parent_cfg.model
    if ext.logn:  # log-n attention scaling beyond the original length, on top of the frequency scaling
        model = replace(model, attn_scale="logn", logn_length=scaling.original_length)
    return replace(parent_cfg, model=model, pos=pos, train=train, extend=ext)


def extension_record(
    scaling: RopeScalingConfig,
    ext: ExtendConfig,
    parent_sha: str,
    parent_length: int,
    *,
    search: dict[str, Any] | None = None,
    layers: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """meta.json `extend`: the settings that identify the extension (`child_run.IDENTITY_KEYS`) plus provenance
    (`layers`: which of a layout's RoPE layers were scaled, `rope_layers.describe_entries`)."""
    assert scaling.original_length is not None
    finetune = None
    if ext.finetune_steps > 0:
        finetune = {
            "steps": ext.finetune_steps,
            "seq_len": finetune_length(ext, scaling.original_length),
            "lr": ext.finetune_lr,
            "warmup": ext.finetune_warmup,
        }
        if ext.pose:  # only then, so the records of earlier extensions stay what they were
            target = finetune["seq_len"]
            finetune.update(seq_len=scaling.original_length, pose_length=target, pose_chunks=ext.pose_chunks)
    record = {
        "method": scaling.method,
        "scaling": dataclasses.asdict(scaling),
        "finetune": finetune,
        "parent_weights_sha256": parent_sha,
        "parent_train_length": parent_length,
        "posenc_version": __version__,
    }
    if ext.logn:  # only then, so the records of earlier extensions stay what they were
        record["logn"] = {"length": scaling.original_length}
    if search is not None:  # LongRoPE's searched factors: the search's settings and the tokens it scored
        record["search"] = search
    if layers is not None:  # a layout's scaled layers (absent for plain runs, whose records stay as they were)
        record["layers"] = layers
    return record


def _frequency_numbers(
    scaling: RopeScalingConfig, rotary: int, base: float
) -> tuple[float, dict[str, int], tuple[float, float]]:
    """(attention factor, regions, longest wavelength before/after); ConfigError for bad parameters and for a
    factor out of the method's range (`limits.frequency_numbers`)."""
    assert scaling.original_length is not None
    return frequency_numbers(
        scaling.method, rotary, base, scaling.factor, scaling.original_length, **scaling.param_values()
    )


# ----------------------------------------------------------------------------------------------------------------
# The entry point.


def extend_run(
    parent_dir: Path | str,
    out_dir: Path | str,
    ext: ExtendConfig,
    *,
    threads: int = 0,
    callback: Callable[[dict[str, Any]], None] | None = None,
    resume: bool = False,
    search: dict[str, Any] | None = None,
) -> ExtendResult:
    """Write the RoPE-scaled child of run `parent_dir` into `out_dir` (fine-tuning it when `ext.finetune_steps`).

    Idempotent: when `out_dir` already holds this extension of these parent weights, a complete child is returned
    as is (status "already_complete") and an interrupted fine-tune is resumed. `out_dir` may exist if empty.
    Refused with a one-line `UserError`, before anything is written: an unknown method, factor <= 1, a parent that
    is not a verified posenc run or not RoPE (or FoPE, with linear or yarn), and an `out_dir` that is the parent or
    holds anything else. `resume=True` additionally requires `out_dir` to hold the extension already. `callback`
    receives `train()`'s events during a fine-tune; `threads` sets the fine-tune's `train.threads` (0: the free
    cores, `cpu_load.default_threads`). `search`: the LongRoPE search that found `ext`'s factors
    (`longrope_search.search_identity`), recorded as `extend.search`.
    """
    validate_extend(ext)
    parent_path, out = Path(parent_dir), Path(out_dir)
    # a transformers directory: a new transformers directory (posenc_cli/extension/hf_extend.py)
    if check_parent(parent_path, out, logn=ext.logn):
        return extend_hf_dir(parent_path, out, ext)
    with use_threads(threads):
        parent = load_run(parent_path)
    refuse_dropped(parent_path, parent.positions_dropped_at, "there are no RoPE frequencies to scale")
    cfg = parent.config
    fope = isinstance(cfg.pos, FopeConfig)  # FoPE: its kept frequencies take PI or YaRN (positional/fope.py)
    entries = [] if fope else rope_entries(cfg, ext.layers, parent_path)  # [] for a plain RoPE or FoPE run
    if ext.logn and cfg.model.attn_scale != "none":
        raise ConfigError(f"{parent_path} already scales attention logits (model.attn_scale={cfg.model.attn_scale})")
    scaling = resolve_scaling(ext, cfg, parent.meta)
    if fope:
        replace(cfg.pos, scaling=scaling).validate()  # linear or yarn only, in one line
    for rope in [] if fope else selected_settings(cfg, entries)[1:]:  # every scaled layer must take this scaling
        _frequency_numbers(scaling, rotary_dim(cfg.model.head_dim, rope.rotary_fraction), rope.base)
    rope = cfg.pos if fope else rope_settings(cfg, entries)  # what the report shows: the run's, or a layer's
    rotary = cfg.model.head_dim if fope else rotary_dim(cfg.model.head_dim, rope.rotary_fraction)
    attention, regions, wavelengths = _frequency_numbers(scaling, rotary, rope.base)
    parent_length, base_length = parent.meta.lengths(cfg)
    layers = describe_entries(cfg, entries, ext.layers)
    record = extension_record(
        scaling, ext, str(parent.meta.files[MODEL_FILE]), parent_length, search=search, layers=layers
    )
    child_cfg = child_config(cfg, scaling, ext, threads, entries)

    check_out_dir(out, record, resume)  # refuses a user's directory before the lock is written into it
    with writer_lock(out):
        existing = check_out_dir(out, record, resume)  # again under the lock: another writer may have finished
        if existing is None:
            claim_run_dir(out)

        result = ExtendResult(
            parent_dir=parent_path,
            out_dir=out,
            status="created",
            method=scaling.method,
            factor=scaling.factor,
            original_length=int(scaling.original_length or parent_length),
            attention_factor=attention,
            rotary_dim=rotary,
            base=float(rope.base),
            regions=regions,
            longest_wavelength=wavelengths,
            parent_scaling=describe_scaling(rope.scaling),
            parent_train_length=parent_length,
            base_length=base_length,
            train_length=child_cfg.train.seq_len if ext.finetune_steps > 0 else parent_length,
        )
        extra = {"parent": str(parent_path.resolve()), "base_length": base_length, "extend": record}
        if ext.finetune_steps > 0:
            res = train(child_cfg, out, init_from=parent_path, meta_extra=extra, callback=callback)
            result.finetune = res
            if res.stopped_reason == "complete":
                result.status = "finetuned"
            elif res.stopped_reason == "already_complete":
                result.status = "already_complete"
            else:
                result.status = "interrupted"
            return result
        if existing is not None and is_complete(out, existing):
            result.status = "already_complete"
            return result
        write_scaled_copy(parent, out, child_cfg, extra, parent_length)
        return result
