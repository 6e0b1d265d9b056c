"""What a training or extension session reports: `TrainResult` (also rebuilt from meta.json for a run that is
already done, `result_from_meta`) and `ExtendResult`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    steps: int
    tokens: int
    train_loss: float | None
    val_loss: float | None
    val_ppl: float | None
    best_val_loss: float | None
    tokens_per_s: float
    wall_time_s: float
    precision: str
    device: str
    stopped_reason: Literal["complete", "already_complete", "interrupted"]
    signal: int | None = None
    positions_dropped_at: int | None = None  # DroPE: the step after which the model has no positions (train.drope_at)


ExtendStatus = Literal["created", "finetuned", "already_complete", "interrupted"]


@dataclass
class ExtendResult:
    """What `extend.extend_run` (or `hf_extend.extend_hf_dir`) did, plus the before/after numbers of the summary."""

    parent_dir: Path
    out_dir: Path
    status: ExtendStatus
    method: str
    factor: float
    original_length: int
    attention_factor: float  # multiplies cos and sin (yarn; 1 for the others)
    rotary_dim: int
    base: float
    regions: dict[str, int]  # frequency pairs that keep / blend / interpolate (`scaling.frequency_regions`)
    longest_wavelength: tuple[float, float]  # tokens, (before, after); dynamic: after = at factor·L tokens
    parent_scaling: str  # "none", or the parent's own scaling when it was already extended
    parent_train_length: int
    base_length: int
    train_length: int
    finetune: TrainResult | None = None


def result_from_meta(run_dir: Path, meta: dict[str, Any]) -> TrainResult:
    """The result of a run that is already complete, as its meta.json records it."""
    val = meta.get("val_loss")
    return TrainResult(
        run_dir=run_dir,
        step=int(meta["step"]),
        steps=int(meta.get("steps", meta["step"])),
        tokens=int(meta.get("tokens", 0)),
        train_loss=meta.get("train_loss"),
        val_loss=val,
        val_ppl=math.exp(val) if val is not None and val < 700 else None,
        best_val_loss=meta.get("best_val_loss"),
        tokens_per_s=float(meta.get("tokens_per_s") or 0.0),
        wall_time_s=float(meta.get("wall_time_s") or 0.0),
        precision=str(meta.get("precision")),
        device=str(meta.get("device")),
        stopped_reason="already_complete",
        positions_dropped_at=meta.get("positions_dropped_at"),
    )
