"""Registry of model options: switches in `model=` that change the attention or the block around it.

One module per option, each registering a `base.ModelOption` subclass named as its `ModelConfig` field:
learned attention sinks (`attn_sinks`, GPT-OSS), the output gate (`attn_gate`, Qiu et al. 2025), QK-norm
(`qk_norm`, Qwen3 / Llama 4) and Canon layers (`canon`, Allen-Zhu 2025). A block builds the options its config
switches on (`LayerOptions`) and calls their hooks at fixed points; the model and the attention layer name no
option. docs/commands/model-options.md has the formulas, references and costs.
"""

from __future__ import annotations

from torch import Tensor, nn

from posenc_cli.config import ModelConfig
from posenc_cli.kv_cache import KVCache
from posenc_cli.options.base import Heads, ModelOption
from posenc_cli.positional.base import PositionalScheme, PositionContext
from posenc_cli.registry import Registry

__all__ = ["LayerOptions", "ModelOption", "enabled", "register", "registry"]

_OPTIONS: Registry[type[ModelOption]] = Registry(__name__, "model option", skip=("base",))
register = _OPTIONS.register  # class decorator: make an option an entry of the registry


def registry() -> dict[str, type[ModelOption]]:
    """All registered options by name (sorted)."""
    return _OPTIONS.entries()


def enabled(cfg: ModelConfig) -> list[type[ModelOption]]:
    """The options `cfg` switches on, in hook order (`ModelOption.order`)."""
    return sorted((cls for cls in registry().values() if cls.enabled(cfg)), key=lambda cls: (cls.order, cls.name))


class LayerOptions(nn.ModuleDict):
    """One layer's options, by name, in hook order; each hook is the options' hooks in turn (empty: the identity,
    and no parameters, so a model without options keeps its state dict and its numbers)."""

    def __init__(self, cfg: ModelConfig, layer: int, scheme: PositionalScheme | None) -> None:
        classes = enabled(cfg)
        if classes and scheme is None:
            raise ValueError("model options need the layer's scheme")
        super().__init__({cls.name: cls(cfg, layer, scheme) for cls in classes})  # type: ignore[arg-type]

    def _each(self) -> list[ModelOption]:
        return list(self.values())  # type: ignore[arg-type]

    def attention_input(self, x: Tensor, ctx: PositionContext, cache: KVCache | None) -> Tensor:
        for option in self._each():
            x = option.attention_input(x, ctx, cache)
        return x

    def heads(self, q: Tensor, k: Tensor, v: Tensor, ctx: PositionContext, cache: KVCache | None) -> Heads:
        for option in self._each():
            q, k, v = option.heads(q, k, v, ctx, cache)
        return q, k, v

    def rotated(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        for option in self._each():
            q, k = option.rotated(q, k)
        return q, k

    def sink_logits(self) -> Tensor | None:
        for option in self._each():
            sinks = option.sink_logits()
            if sinks is not None:
                return sinks
        return None

    def output(self, y: Tensor, x: Tensor) -> Tensor:
        for option in self._each():
            y = option.output(y, x)
        return y

    def mlp_input(self, x: Tensor, ctx: PositionContext, cache: KVCache | None) -> Tensor:
        for option in self._each():
            x = option.mlp_input(x, ctx, cache)
        return x

    def mlp_hidden(self, h: Tensor, ctx: PositionContext, cache: KVCache | None) -> Tensor:
        for option in self._each():
            h = option.mlp_hidden(h, ctx, cache)
        return h
