"""The training loop of the benchmarks whose positions carry targets of their own (`encoder_protocol.py`,
`tagging_protocol.py`), not the next token that posenc's trainer (`posenc_cli.run.train`) predicts.

One step: the forward the caller gives (causal or not), the cross-entropy over the positions whose target is not
`IGNORE`, then posenc's own optimisation (`build_optimizer`'s AdamW, `lr_at`'s warm-up + cosine schedule, the
gradient clipped to `train.grad_clip`), so a protocol comparison differs from posenc's training in the targets only.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc_cli.config import Config
from posenc_cli.model import GPT
from posenc_cli.run.device import autocast
from posenc_cli.run.optim import build_optimizer, lr_at

IGNORE = -100  # cross_entropy's ignore_index: a position without a target
Forward = Callable[[GPT, Tensor], Tensor]  # (model, x (B, T)) -> logits (B, T, V)
OptionsT = TypeVar("OptionsT")
LOOP_OPTIONS = {
    "steps": int,
    "batch": int,
    "lr": float,
    "warmup": int,
    "eval_examples": int,
    "seed": int,
    "threads": int,
}


def causal_forward(model: GPT, x: Tensor) -> Tensor:
    return model(x)


def train_on_targets(
    model: GPT,
    batches: Iterable[tuple[Tensor, Tensor]],
    cfg: Config,
    precision: str,
    forward: Forward = causal_forward,
) -> list[float]:
    """One AdamW step per (x, y) batch, x and y (B, T), the loss the mean cross-entropy over y's targets; the loss
    per step."""
    device = torch.device("cpu")
    optimizer = build_optimizer(model, cfg.train, device)
    model.train()
    losses = []
    for step, (x, y) in enumerate(batches):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg.train)
        with autocast(device, precision):  # type: ignore[arg-type]
            logits = forward(model, x)  # (B, T, V)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def parse_options(
    p: argparse.ArgumentParser, options: Callable[..., OptionsT], argv: Sequence[str] | None = None
) -> tuple[OptionsT, Path | None]:
    """`p` (the script's own flags added) plus the loop's (`LOOP_OPTIONS`, defaults from the `options` dataclass)
    and `--out`, parsed: (`options(...)`, the JSON path or None)."""
    defaults: Any = options
    for name, kind in LOOP_OPTIONS.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=getattr(defaults, name))
    p.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = vars(p.parse_args(argv))
    out = args.pop("out")
    return options(**args), out
