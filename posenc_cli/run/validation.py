"""Validation during training: fixed, evenly spaced windows of the validation split, and the mean next-token loss
over them (the `val_loss` of metrics.jsonl and meta.json).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc_cli.errors import DataError
from posenc_cli.run.device import autocast


def validation_batches(val: np.ndarray, batch_size: int, seq_len: int, n_batches: int) -> Tensor:
    """Fixed, evenly spaced validation windows: (n_batches, B, seq_len + 1) int64."""
    span = seq_len + 1
    if len(val) < span:
        raise DataError(f"the validation split has {len(val)} tokens; train.seq_len={seq_len} needs at least {span}")
    starts = np.linspace(0, len(val) - span, n_batches * batch_size).astype(np.int64)
    idx = starts[:, None] + np.arange(span)[None, :]  # (n·B, T+1)
    windows = torch.from_numpy(np.asarray(val[idx], dtype=np.int64))
    return windows.view(n_batches, batch_size, span)


@torch.no_grad()
def evaluate_loss(model: nn.Module, windows: Tensor, device: torch.device, precision: str) -> float:
    """Mean next-token cross-entropy (nats/token) over the fixed validation windows."""
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=device)
    for batch in windows:
        batch = batch.to(device)
        with autocast(device, precision):  # type: ignore[arg-type]
            logits = model(batch[:, :-1])
        total += F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
    model.train(was_training)
    return float(total) / len(windows)


__all__ = ["evaluate_loss", "validation_batches"]
