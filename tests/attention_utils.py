"""Attention helpers for tests: forcing a model's attention layers to score by small query chunks; the largest
allocation of a piece of code (`LargestAllocation`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from posenc_cli.attention import CausalSelfAttention


def force_chunks(model: nn.Module, chunk: int | None) -> None:
    """Every attention layer of `model` scores `chunk` queries at a time (`CausalSelfAttention.chunk_size`; None:
    back to the budget's chunks), so a short test row crosses chunk borders as a long one does."""
    for module in model.modules():
        if isinstance(module, CausalSelfAttention):
            module.chunk_size = chunk


class LargestAllocation(TorchDispatchMode):
    """While active, the largest storage (bytes) any torch operation returns, and that tensor's shape: views
    (`expand`) count at their base's size, so a broadcast (Tq, 1) against (1, Tk) is not a (Tq, Tk) allocation."""

    def __init__(self) -> None:
        super().__init__()
        self.nbytes = 0
        self.shape: tuple[int, ...] = ()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > self.nbytes:
                self.nbytes, self.shape = t.untyped_storage().nbytes(), tuple(t.shape)
        return out
