"""Attention-logit length scaling (`model.attn_scale`): the per-query factors that multiply q before attention."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def logn_factor(positions: Tensor, length: int) -> Tensor:
    """Qwen's `use_logn_attn`: max(1, log(n)/log(L)) fp32 for n = position id + 1, shaped like `positions` (T,) or
    (B, T). Identity (1) at n ≤ L; multiplying q by it multiplies query n's logits by it."""
    n = positions.to(torch.float32) + 1
    return (n.log() / math.log(length)).clamp_min(1.0)


def ssmax_factor(token_index: Tensor) -> Tensor:
    """log(n) fp32 (T,) for n = token index + 1, the number of keys a causal query sees (Nakanishi 2025, SSMax:
    logits × s·log n, s a trained parameter per head)."""
    return (token_index.to(torch.float32) + 1).log()
