"""Named per-layer layouts of the 2025 models (`pos=irope|rnope-swa|smollm3|gemma3`), as `Layout` presets.

Each is a `LayoutConfig` whose `layers` default to the model's pattern (see `positional.layout` for the entry keys;
`pos.layers=...` replaces the pattern, `pos.window_fraction=...` the window). At posenc's scale the windows, chunks
and temperature floors are stated relative to the training length L: W = C = F = L/4 (`window_fraction` 0.25;
the models' own, 1024-8192 tokens, are 1/32 or less of their context lengths, which at L = 128 would leave 4
tokens). posenc's choice, citing nothing. The RoPE layers keep posenc's RoPE defaults (base 10,000, rotate_half)
unless the model's pattern differs in base (Gemma 3), so a preset differs from `pos=rope` only in its layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posenc_cli.positional import register
from posenc_cli.positional.layout import Layout, LayoutConfig


def _every_fourth(other: dict[str, Any], fourth: dict[str, Any]) -> list[dict[str, Any]]:
    """Layers 0-2 `other`, layer 3 `fourth`: the period-4 pattern of Llama 4, Command A and SmolLM3
    (`transformers`: a layer is NoPE when (i + 1) % no_rope_layer_interval == 0, interval 4)."""
    return [dict(other), dict(other), dict(other), dict(fourth)]


@dataclass(kw_only=True)
class IRopeConfig(LayoutConfig):
    name: str = "irope"
    layers: list[Any] = field(
        default_factory=lambda: _every_fourth({"name": "rope", "span": "chunked"}, {"name": "nope", "temperature": 0.1})
    )


@register
class IRoPE(Layout):
    """Llama 4's iRoPE (`transformers` `Llama4TextConfig`: `no_rope_layer_interval` 4, `attention_chunk_size` 8192
    on the RoPE layers, `attn_temperature_tuning` with `attn_scale` 0.1 and `floor_scale` 8192 on the NoPE layers,
    which attend globally). Not reproduced: the L2 QK-norm of Llama 4's RoPE layers (`use_qk_norm`), which changes
    the attention scale of every RoPE layer, not its positions."""

    name = "irope"
    config_cls = IRopeConfig
    paper = "Meta 2025, Llama 4 (iRoPE; transformers models/llama4)"


@dataclass(kw_only=True)
class RNopeSwaConfig(LayoutConfig):
    name: str = "rnope-swa"
    layers: list[Any] = field(
        default_factory=lambda: _every_fourth({"name": "rope", "span": "sliding"}, {"name": "nope"})
    )


@register
class RNopeSWA(Layout):
    """RNoPE-SWA (Yang et al. 2025, "Rope to Nope and Back Again", arXiv 2501.18795; Cohere Command A): three
    sliding-window RoPE layers (window 4096 in Command A) to one full-attention NoPE layer."""

    name = "rnope-swa"
    config_cls = RNopeSwaConfig
    paper = "Yang et al. 2025, arXiv:2501.18795"


@dataclass(kw_only=True)
class SmolLM3Config(LayoutConfig):
    name: str = "smollm3"
    layers: list[Any] = field(default_factory=lambda: _every_fourth({"name": "rope"}, {"name": "nope"}))


@register
class SmolLM3(Layout):
    """SmolLM3 (Hugging Face 2025; `transformers` `SmolLM3Config`: `no_rope_layer_interval` 4): RoPE dropped in every
    4th layer, full attention everywhere."""

    name = "smollm3"
    config_cls = SmolLM3Config
    paper = "Hugging Face 2025, SmolLM3 (transformers models/smollm3)"


@dataclass(kw_only=True)
class Gemma3Config(LayoutConfig):
    name: str = "gemma3"
    layers: list[Any] = field(
        default_factory=lambda: (
            [{"name": "rope", "base": 10_000.0, "span": "sliding"}] * 5 + [{"name": "rope", "base": 1_000_000.0}]
        )
    )


@register
class Gemma3(Layout):
    """Gemma 3 (Gemma Team 2025, arXiv 2503.19786; `transformers` `Gemma3TextConfig`: layer i is `full_attention`
    when (i + 1) % 6 == 0, else `sliding_attention` with window 1024): five local layers with RoPE base 10,000 to
    one global layer with base 1,000,000. Needs `model.n_layer` >= 6."""

    name = "gemma3"
    config_cls = Gemma3Config
    paper = "Gemma Team 2025, arXiv:2503.19786"
