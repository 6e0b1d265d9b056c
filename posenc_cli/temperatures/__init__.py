"""Registry of attention temperatures: per-query (and per-head) factors that multiply q before attention.

One module per entry, each registering a frozen dataclass with `@register` (`base.Temperature`): Qwen's log-n
(`logn`), SSMax (`ssmax`), Llama 4's floor-log (`floor-log`, given per layer by a layout), DroPE's β (`drope`) and
NoPE HeadScale (`head-scale`). `model.attn_scale` names the entry every layer applies (`from_model`); a layout gives
a layer its own (`positional.layout`). The attention layer applies either the same way in training, evaluation, the
KV cache and viz (`attention.layer.CausalSelfAttention.tempered`).
"""

from __future__ import annotations

from posenc_cli.config import ModelConfig
from posenc_cli.registry import Registry
from posenc_cli.temperatures.base import Temperature

__all__ = ["Temperature", "from_model", "register", "registry", "temperature_class"]

_TEMPERATURES: Registry[type[Temperature]] = Registry(__name__, "attention temperature", skip=("base",))
register = _TEMPERATURES.register  # class decorator: make a temperature an entry of the registry


def registry() -> dict[str, type[Temperature]]:
    """All registered temperatures by name (sorted)."""
    return _TEMPERATURES.entries()


def temperature_class(name: str) -> type[Temperature]:
    return _TEMPERATURES.get(name, "unknown attention temperature {name} (available: {available})")


def from_model(cfg: ModelConfig) -> Temperature | None:
    """The temperature `model.attn_scale` names, built from the model's settings; None for `none`."""
    if cfg.attn_scale == "none":
        return None
    return temperature_class(cfg.attn_scale).from_model(cfg)
