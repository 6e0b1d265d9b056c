"""Validation during training: fixed validation rows and the mean next-token loss over their scored targets (the
`val_loss` of metrics.jsonl and meta.json).

Rows follow `train.packing`: evenly spaced windows of the validation split under `stream`; evenly spaced examples,
one per row (`data.rows.example_rows`), under `none` and `document` (packing examples changes no example's loss).
Under `train.loss_on=answer`, or with padded rows, the loss is the mean over the targets that count, pooled over all
rows (not a mean of per-row means), as the training loss is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc_cli.data.rows import check_examples_fit, example_rows, find_examples
from posenc_cli.errors import DataError
from posenc_cli.run.device import autocast


@dataclass
class ValidationSet:
    """`windows` (n_batches, B, T+1) int64; `weights` (n_batches, B, T) bool, the targets that count (None: all)."""

    windows: Tensor
    weights: Tensor | None = None


def _window_starts(n_tokens: int, batch_size: int, seq_len: int, n_batches: int) -> np.ndarray:
    span = seq_len + 1
    if n_tokens < span:
        raise DataError(f"the validation split has {n_tokens} tokens; train.seq_len={seq_len} needs at least {span}")
    return np.linspace(0, n_tokens - span, n_batches * batch_size).astype(np.int64)


def validation_batches(val: np.ndarray, batch_size: int, seq_len: int, n_batches: int) -> Tensor:
    """Fixed, evenly spaced validation windows: (n_batches, B, seq_len + 1) int64."""
    starts = _window_starts(len(val), batch_size, seq_len, n_batches)
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]  # (n·B, T+1)
    windows = torch.from_numpy(np.asarray(val[idx], dtype=np.int64))
    return windows.view(n_batches, batch_size, seq_len + 1)


def validation_set(
    val: np.ndarray,
    scored: np.ndarray | None,
    batch_size: int,
    seq_len: int,
    n_batches: int,
    *,
    packing: str = "stream",
    answer_only: bool = False,
    eod_id: int = 0,
) -> ValidationSet:
    """The fixed validation rows of a run: `validation_batches`'s windows under `packing=stream` (weighted by the
    scored mask under `answer_only`), else n_batches · B evenly spaced examples, one per row, right-padded."""
    if packing == "stream":
        windows = validation_batches(val, batch_size, seq_len, n_batches)
        if not answer_only or scored is None:
            return ValidationSet(windows)
        starts = _window_starts(len(val), batch_size, seq_len, n_batches)
        idx = starts[:, None] + np.arange(1, seq_len + 1)[None, :]  # (n·B, T): the targets
        weights = torch.from_numpy(np.asarray(scored[idx]).astype(bool))
        return ValidationSet(windows, weights.view(n_batches, batch_size, seq_len))
    examples = find_examples(val, eod_id)
    check_examples_fit(examples, seq_len, packing, "validation")
    picks = np.linspace(0, examples.ends.size - 1, n_batches * batch_size).astype(np.int64)  # (n·B,)
    rows = example_rows(val, scored, examples, picks, seq_len, eod_id, answer_only)
    assert rows.weights is not None
    return ValidationSet(
        rows.tokens.view(n_batches, batch_size, seq_len + 1), rows.weights.view(n_batches, batch_size, seq_len)
    )


def scored_nll(logits: Tensor, targets: Tensor, weights: Tensor) -> Tensor:
    """Sum of the next-token NLL over the targets that count: logits (B, T, V), targets and weights (B, T)."""
    nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")  # (B·T,)
    return (nll * weights.flatten().to(nll.dtype)).sum()


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


@torch.no_grad()
def evaluate_scored(model: nn.Module, data: ValidationSet, device: torch.device, precision: str) -> tuple[float, float]:
    """(sum of NLL, number of targets) over the weighted validation rows: loss per scored token = sum / number."""
    assert data.weights is not None
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=device, dtype=torch.float64)
    for batch, weights in zip(data.windows, data.weights, strict=True):
        batch = batch.to(device)
        with autocast(device, precision):  # type: ignore[arg-type]
            logits = model(batch[:, :-1])
        total += scored_nll(logits, batch[:, 1:], weights.to(device)).double()
    model.train(was_training)
    return float(total), float(data.weights.sum())


__all__ = [
    "ValidationSet",
    "evaluate_loss",
    "evaluate_scored",
    "scored_nll",
    "validation_batches",
    "validation_set",
]
