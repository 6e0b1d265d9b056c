"""AdamW for posenc runs: parameter groups with decoupled weight decay, and the learning-rate schedule.

Weight decay (Loshchilov & Hutter 2019, decoupled: p <- p - lr·wd·p) applies to weight matrices only; norms,
biases, token embeddings and the positional scheme's own tables (learned position embeddings, ALiBi slopes, ...)
are not decayed, as in GPT-2/nanoGPT practice. The schedule is linear warm-up then cosine decay to lr·min_lr_ratio.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from posenc_cli.config import TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of update `step` (0-based): linear warm-up to `lr`, then cosine decay to `lr·min_lr_ratio`."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    lr_min = cfg.lr * cfg.min_lr_ratio
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return lr_min + 0.5 * (cfg.lr - lr_min) * (1.0 + math.cos(math.pi * progress))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on matrices only; never on norms, biases, embeddings or the positional scheme's tables."""
    no_decay: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            no_decay.add(id(module.weight))
    scheme = getattr(model, "scheme", None)
    if isinstance(scheme, nn.Module):
        no_decay.update(id(p) for p in scheme.parameters())
    decay, keep = [], []
    for p in model.parameters():  # tied weights appear once
        if not p.requires_grad:
            continue
        (keep if p.ndim < 2 or id(p) in no_decay else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over `param_groups`, with PyTorch's fused kernel on CPU and CUDA (one pass over all parameters; the
    default per-tensor loop costs more than the forward pass of a small model on CPU). A run resumed from a
    checkpoint written without it keeps the saved groups' setting, so its numerics stay those of its first session."""
    groups = param_groups(model, cfg.weight_decay)
    fused = device.type in ("cpu", "cuda")
    try:
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused or None)
    except RuntimeError:  # a torch build without the fused kernel for this device
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
