"""The interface of a model option (one registry entry per option, `posenc_cli.options`).

An option is an `nn.Module` built once per layer from the model's config and the scheme that layer attends with
(`LayerOptions`); it owns its parameters (checkpoint keys `blocks.<i>.options.<name>.*`) and overrides the hooks
it needs. Every hook's default returns its input unchanged, so a layer without options computes exactly what it did
before options existed. The hooks, in the order a block calls them:

1. `attention_input(x)`: the attention's input, after the block's first norm (Canon A);
2. `heads(q, k, v)`: the projected heads (B, T, H, hd), before the cache and the scheme's rotation (RMS QK-norm,
   Canon B);
3. `rotated(q, k)`: q and k (B, H, T, hd) after the scheme's rotation, before any temperature (L2 QK-norm);
4. `sink_logits()`: a learned logit per head appended to the softmax's normaliser (`attention.choose` sends the
   layer to a road that computes its weights itself);
5. `output(y, x)`: the attention output (B, T, H, hd) before the output projection, with the attention's input x
   (the output gate);
6. `mlp_input(x)` and `mlp_hidden(h)`: the MLP's input after the second norm, and its hidden layer before the
   activation (Canon C, D).

Hooks that mix tokens (Canon) read `ctx.documents` (packed rows: no token sees another document's) and keep what a
later forward needs in the KV cache (`KVCache.history`), so cached decoding equals the full forward.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from posenc_cli.config import ModelConfig
from posenc_cli.kv_cache import KVCache
from posenc_cli.positional.base import PositionalScheme, PositionContext

Heads = tuple[Tensor, Tensor, Tensor]


class ModelOption(nn.Module):
    """Base class of every option: `name` (the registry's key and the `ModelConfig` field that switches it on),
    `paper`, `order` (options run their hooks in increasing order: QK-norm before Canon B, as the reference places
    them) and `off` (the field's value that means off)."""

    name: ClassVar[str]
    paper: ClassVar[str] = ""
    order: ClassVar[int] = 0
    off: ClassVar[object] = "none"
    samples: ClassVar[tuple[object, ...]] = ()  # values of `model.<name>` that switch it on (tests, docs)

    def __init__(self, cfg: ModelConfig, layer: int, scheme: PositionalScheme) -> None:
        super().__init__()
        self.layer = layer

    @classmethod
    def enabled(cls, cfg: ModelConfig) -> bool:
        """Whether `model.<name>` switches the option on."""
        return getattr(cfg, cls.name) != cls.off

    def attention_input(self, x: Tensor, ctx: PositionContext, cache: KVCache | None) -> Tensor:
        """x (B, T, D) -> (B, T, D)."""
        return x

    def heads(self, q: Tensor, k: Tensor, v: Tensor, ctx: PositionContext, cache: KVCache | None) -> Heads:
        """q, k, v (B, T, H, hd) of the new tokens -> the same shapes."""
        return q, k, v

    def rotated(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, hd), k (B, H, T, hd) as the scheme rotated them -> the same shapes."""
        return q, k

    def sink_logits(self) -> Tensor | None:
        """(H,) logits appended to every query's softmax row (None: none)."""
        return None

    def output(self, y: Tensor, x: Tensor) -> Tensor:
        """y (B, T, H, hd), the attention's output per head, x (B, T, D) the attention's input -> (B, T, H, hd)."""
        return y

    def mlp_input(self, x: Tensor, ctx: PositionContext, cache: KVCache | None) -> Tensor:
        """x (B, T, D) -> (B, T, D)."""
        return x

    def mlp_hidden(self, h: Tensor, ctx: PositionContext, cache: KVCache | None) -> Tensor:
        """h (B, T, mlp_ratio·D) before the activation -> the same shape."""
        return h
