"""Named per-layer layouts of the 2025-26 models (`pos=irope|rnope-swa|smollm3|gemma3|gpt-oss|gemma4`), as `Layout`
presets.

Each is a `LayoutConfig` whose `layers` default to the model's pattern (see `positional.layout` for the entry keys;
`pos.layers=...` replaces the pattern, `pos.window_fraction=...` the window). At posenc's scale the windows, chunks
and temperature floors are stated relative to the training length L: W = C = F = L/4 (`window_fraction` 0.25;
the models' own, 1024-8192 tokens, are 1/32 or less of their context lengths, which at L = 128 would leave 4
tokens). posenc's choice, citing nothing. The RoPE layers keep posenc's RoPE defaults (base 10,000, rotate_half)
unless the model's pattern differs in base (Gemma 3, GPT-OSS, Gemma 4) or in the pairs that rotate (Gemma 4's
proportional RoPE), so a preset differs from `pos=rope` only in its layout; `pos=gpt-oss` also switches the model's
learned attention sinks on (`model.attn_sinks`, `posenc_cli.options`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posenc_cli.config import ModelConfig
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


@dataclass(kw_only=True)
class GptOssConfig(LayoutConfig):
    """`sinks`: switch `model.attn_sinks` on (GPT-OSS has them on every layer); false leaves `model.attn_sinks` as
    given (the layout alone)."""

    name: str = "gpt-oss"
    layers: list[Any] = field(
        default_factory=lambda: [
            {"name": "rope", "base": 150_000.0, "span": "sliding"},
            {"name": "rope", "base": 150_000.0},
        ]
    )
    sinks: bool = True

    def resolve(self, model: ModelConfig, train_length: int) -> None:
        super().resolve(model, train_length)
        if self.sinks:  # written into the run's model config, which records it
            model.attn_sinks = True


@register
class GptOss(Layout):
    """GPT-OSS (OpenAI 2025, arXiv 2508.10925; `transformers` `GptOssConfig`: layer i `sliding_attention` when i is
    even, window 128, else `full_attention`; RoPE θ 150,000; learned sinks on every layer): sliding and full RoPE
    layers 1:1 with `model.attn_sinks` on. The window: `window_fraction` × L (0.25, as the other presets; GPT-OSS's
    128 tokens are 1/32 of its original 4,096, `pos.window_fraction=0.03125` for that ratio). Not reproduced: the
    static YaRN ×32 (β_fast 32, β_slow 1, original 4,096) the checkpoints ship with, a context extension
    (`pos.layers` entries take `scaling`; `posenc extend`), and grouped-query attention (H_kv 8 of 64)."""

    name = "gpt-oss"
    config_cls = GptOssConfig
    paper = "OpenAI 2025, gpt-oss (arXiv 2508.10925; transformers models/gpt_oss)"


@dataclass(kw_only=True)
class Gemma4Config(LayoutConfig):
    name: str = "gemma4"
    layers: list[Any] = field(
        default_factory=lambda: (
            [{"name": "rope", "base": 10_000.0, "span": "sliding"}] * 5
            + [{"name": "rope", "base": 1_000_000.0, "p": 0.25}]
        )
    )


@register
class Gemma4(Layout):
    """Gemma 4 (`transformers` `Gemma4TextConfig`: layer i `sliding_attention` unless (i + 1) % 6 == 0, window 512,
    RoPE θ 10,000; global layers `proportional` RoPE, partial factor 0.25, θ 1,000,000): five sliding RoPE layers to
    one global layer whose RoPE keeps the ⌊0.25·hd/2⌋ fastest pairs of θ_k = 10⁶^(−2k/hd) over the whole head and
    gives the rest frequency 0 (posenc's p-RoPE, `pos.p=0.25`, is that count and spacing). The window:
    `window_fraction` × L. Not reproduced: the global layers' own head dimension (`global_head_dim` 512 against 256;
    posenc has one head dimension per model), the last layer forced global (the pattern repeats: use a multiple of
    6 layers), k = v with a weightless v-norm (`attention_k_eq_v`), the attention scale 1 with QK-norm (posenc's
    `model.qk_norm=rms` keeps 1/√hd). Needs `model.n_layer` >= 6."""

    name = "gemma4"
    config_cls = Gemma4Config
    paper = "Google 2026, Gemma 4 (transformers models/gemma4)"
