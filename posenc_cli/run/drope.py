"""DroPE's training switch (Gelberg et al. 2025, "Extending the Context of Pretrained LLMs by Dropping Their
Positional Embeddings", arXiv 2512.12167): train with the configured scheme, then remove every positional signal
and keep training the same weights ("recalibration"); the model that results has no positions at all.

`train.drope_at = k` (0: off). Updates 1..k use the scheme; right after update k (before that step's validation and
checkpoint) the model drops its positions (`GPT.drop_positions`), and updates k+1.. train it without. So every
checkpoint at step >= k holds the dropped model, and meta.json records the switch as `positions_dropped_at: k`
(`DROPPED_KEY`), which is what a loader reads to rebuild it (`dropped_at`). In metrics.jsonl, step k's train_loss
is the last one with positions and its val_loss the first without. k = train.steps is allowed: dropping with no
recalibration at all, the control the paper's recalibration is measured against. A run continued past k that kept
its positions (--force-config with a new drope_at, or more steps) drops them when it resumes, and records that step.

What is dropped: the scheme's every hook, in every layer (a layout's schemes too), and the scheme's own parameters
(a learned table, learned slopes), which leave the model, its checkpoint and the optimizer. Every other weight keeps
its AdamW moments and step count, under the same learning-rate schedule. Not dropped: each layer's span and
temperature (a layout's sliding windows, chunks and Llama 4's floor-log temperature: they restrict or scale
attention, they encode no position into q, k or the scores) and model.attn_scale, as the reference drops only RoPE
and keeps Qwen2's `sliding_window` (`custom_models/attention.py:285`, passed to the attention function of every
layer). Runs dropped before posenc kept the layout (meta.json without `KEPT_KEY`) dropped spans and temperatures
too, and load so (`drop_as_recorded`). A child trained from a dropped run (`train(init_from=...)`) has no positions
from its step 0 (`positions_dropped_at: 0`) and keeps what its parent kept.

The authors' code (SakanaAI/DroPE 260a8bb) holds the recalibration of pretrained transformers models only:
`custom_models/drope.py` (lines 104-137) swaps every layer's attention for `custom_models/attention.py`'s NoPE
variant, which keeps all weights (line 94) and sets RoPE's cos to 1 and sin to 0 (lines 58-63), the identity
rotation, and `train.py` (lines 102-117) trains it with a new Trainer, so a new optimizer and schedule
(`cfgs/run_cfg/smollm_360m_drope.yaml`: lr 3e-4, 120K steps). posenc switches within one run, as the paper's
from-scratch runs do (dropping at step 14K of 16K), and keeps the optimizer's state there: whether those runs
restarted the optimizer is not in the released code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from posenc_cli.config import Config
from posenc_cli.errors import CheckpointError, ConfigError
from posenc_cli.positional import PositionalScheme, PositionContext, build_scheme
from posenc_cli.run.meta import is_whole_number

if TYPE_CHECKING:
    from posenc_cli.model import GPT

DROPPED_KEY = "positions_dropped_at"  # meta.json: the step after which the model has no positions
KEPT_KEY = "positions_dropped_kept_layout"  # meta.json: the dropped model kept its layers' spans and temperatures


def dropped_record(step: int, keep_layout: bool = True) -> dict[str, Any]:
    """The meta.json keys of a switch after update `step`."""
    return {DROPPED_KEY: step, KEPT_KEY: keep_layout}


def drop_as_recorded(model: GPT, meta: dict[str, Any]) -> None:
    """`model.drop_positions` as the run of `meta` (meta.json) dropped them: keeping the layout unless the run was
    dropped before posenc kept it (no `KEPT_KEY`)."""
    model.drop_positions(keep_layout=bool(meta.get(KEPT_KEY, False)))


def has_positional_signal(scheme: PositionalScheme, n_layer: int) -> bool:
    """Whether any layer of `scheme` has a positional hook to drop (spans and temperatures are kept)."""
    ctx = PositionContext(positions=torch.arange(2))
    scheme.prepare(ctx)
    return any(scheme.layer_view(layer, ctx).scheme.hooks for layer in range(n_layer))


def check_drope(cfg: Config) -> None:
    """`ConfigError` (one line) when train.drope_at is set but cannot do what it says: a step past the run's end
    (the switch would never happen, yet the config would say it did), or a scheme with nothing to drop."""
    k, steps = cfg.train.drope_at, cfg.train.steps
    if not k:
        return
    if k > steps:
        raise ConfigError(
            f"train.drope_at={k} is past train.steps={steps}: positions would never be dropped; set "
            f"train.drope_at to at most {steps}, or 0 (off)"
        )
    if not has_positional_signal(build_scheme(cfg.pos, cfg.model, cfg.train.seq_len), cfg.model.n_layer):
        raise ConfigError(
            f"train.drope_at={k}: pos={cfg.pos.name} has no positional signal to drop; train with the scheme to "
            "drop (e.g. pos=rope), or set train.drope_at=0"
        )


def dropped_at(meta: dict[str, Any], path: Any) -> int | None:
    """The step after which the checkpoint of `meta` (meta.json, read at `path`) has no positions; None if it has
    them. `CheckpointError` when the field is not a whole number in [0, step]."""
    value = meta.get(DROPPED_KEY)
    if value is None:
        return None
    if not (is_whole_number(value) and 0 <= value <= meta["step"]):
        raise CheckpointError(f"{path}: field '{DROPPED_KEY}' is {value!r}, expected a whole number in [0, step]")
    return int(value)


def refuse_dropped(path: Any, k: int | None, action: str) -> None:
    """`ConfigError` (one line) for a command that needs the scheme (`action`, e.g. "there is no RoPE to scale")
    on a run that dropped its positions after step `k` (None: it kept them, nothing to refuse)."""
    if k is not None:
        raise ConfigError(f"{path} dropped its positions after step {k} (train.drope_at): {action}")


def check_dropped(cfg: Config, meta: dict[str, Any], path: Any) -> int | None:
    """`dropped_at`, checked against the config: a checkpoint at or past its train.drope_at must say it dropped
    its positions (one that does not was trained by a posenc that ignored the setting, and would be labelled as
    what it is not)."""
    k = dropped_at(meta, path)
    step, at = int(meta["step"]), cfg.train.drope_at
    if k is None and at and step >= at:
        raise CheckpointError(
            f"{path}: train.drope_at={at} but the checkpoint at step {step} kept its positions (trained by a posenc "
            "without the switch?); retrain it"
        )
    return k


__all__ = [
    "DROPPED_KEY",
    "KEPT_KEY",
    "check_drope",
    "check_dropped",
    "drop_as_recorded",
    "dropped_at",
    "dropped_record",
    "has_positional_signal",
    "refuse_dropped",
]
