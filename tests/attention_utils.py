"""Attention helpers for tests: forcing a model's attention layers to score by small query chunks; the largest
allocation of a piece of code (`LargestAllocation`); a short window's whole attention matrices (`layer_qkv`,
`attention_weights`, from `analysis.viz_data`'s chunks)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from posenc_cli.analysis.viz_data import attention_chunks, layer_views
from posenc_cli.attention import CausalSelfAttention
from posenc_cli.positional import PositionalScheme, PositionContext
from posenc_cli.positional.span import FULL, Span


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


def layer_qkv(model: Any, idx: Tensor) -> Iterator[tuple[int, Tensor, Tensor, Tensor, PositionContext]]:
    """`layer_views` as tuples (layer, q, k, v, the layer's context); attend them with the layer's scheme and span
    (`layer_views` gives both; a plain scheme's are `model.scheme` and the full span)."""
    for item in layer_views(model, idx):
        yield item.layer, item.q, item.k, item.v, item.view.ctx


def attention_weights(
    q: Tensor,
    k: Tensor,
    scheme: PositionalScheme,
    layer: int,
    ctx: PositionContext,
    *,
    chunk: int | None = None,
    span: Span = FULL,
) -> Tensor:
    """The full (B, H, T, T) attention weights of a short window (`viz_data.attention_chunks` put together)."""
    B, H, T, _ = q.shape
    out = torch.zeros(B, H, T, T)
    for start, w in attention_chunks(q, k, scheme, layer, ctx, chunk=chunk, span=span):
        out[:, :, start : start + w.shape[2], : w.shape[3]] = w
    return out
