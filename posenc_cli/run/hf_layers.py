"""Per-layer attention layouts of `transformers` checkpoints: which layers attend globally, which within a sliding
window or a chunk, which rotate q and k, and which rope parameters each layer type has.

posenc never rebuilds these: a transformers model makes its own masks and rotary tables in its forward
(`masking_utils.create_sliding_window_causal_mask`, `create_chunked_causal_mask`, one rotary table per layer type),
and `hf_run` calls that forward unchanged. The layout is read from the model's config only to state what the model
does (`describe`, recorded in the run's meta) and to choose the training length (`train_length`) and the layers
`posenc extend` scales (`hf_extend`). It is read as `transformers` itself reads it (5.x):

- A config class that declares `layer_types` (Gemma 2/3, Qwen2, SmolLM3, Llama 4, Cohere 2, ...) gives each layer
  its type; its modeling code picks the mask by it (e.g. `modeling_gemma3.py`, `Gemma3TextModel.forward`:
  `causal_mask_mapping[self.config.layer_types[i]]`). Qwen2 derives it from `use_sliding_window` and
  `max_window_layers` (layers from that index on slide), Gemma 3 from `sliding_window_pattern` (default 6).
- A config without the field (Mistral, Mixtral, Phi-3, Starcoder2) applies its `sliding_window`, when set, to every
  layer (`modeling_mistral.py`: `sliding_window=getattr(self.config, "sliding_window", None)` in every attention).
- RoPE per layer: `no_rope_layers` (SmolLM3, Llama 4; 1 = the layer rotates, 0 = NoPE); Cohere 2 rotates only its
  sliding layers (`modeling_cohere2.py`, `Cohere2Attention.forward`: rope only when `self.sliding_window` is set).
- `rope_parameters` nested by layer type ({"full_attention": {...}, "sliding_attention": {...}}, Gemma 3) give each
  type its own base and scaling (`modeling_rope_utils.py`, `RotaryEmbeddingConfigMixin.nested_rope_parameter_keys`).

- Qwen3-Next's `linear_attention` layers (a gated delta rule, no RoPE) are recurrent: global, NoPE.
- A layer type the model builds no mask for (`MASK_TYPES`: `chunked_attention` in GPT-OSS, whose forward would fail
  with a KeyError) is named by `unread_layer_type`, for a one-line refusal.

A sliding window of W means each query sees itself and the W - 1 tokens before it (`masking_utils.py`,
`sliding_window_overlay`: `kv_idx > q_idx - sliding_window`).

The 2025-26 attention details (`attention_details`, recorded after the layout) are read from the model's own modules
built on the meta device (no weights): learned sinks (GPT-OSS `self_attn.sinks`, (H,)), QK-norms (per head with a
weight: Qwen3, Gemma 3/4, Qwen3-Next, the last two and Gemma 3 as (1 + w); weightless: Llama 4's `qk_norm` on its RoPE
layers; over the whole projection: OLMo 2), Gemma 4's weightless v-norm and Qwen3-Next's sigmoid output gate (q_proj
twice as wide: a gate per channel).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = [
    "FULL",
    "LOCAL",
    "MASK_TYPES",
    "HFLayout",
    "attention_details",
    "hf_layout",
    "train_length",
    "unread_layer_type",
]

FULL = "full_attention"
SLIDING = "sliding_attention"
CHUNKED = "chunked_attention"
LINEAR = "linear_attention"  # Qwen3-Next's gated-delta-rule layers: recurrent, no RoPE
LOCAL = frozenset({SLIDING, CHUNKED})  # layer types that see a bounded span: every other type attends globally
# The layer types each model's forward builds a mask (or a layer) for (`causal_mask_mapping` in its modeling file);
# transformers' config validation accepts any of its known types, and the forward then fails on the others.
MASK_TYPES: dict[str, frozenset[str]] = {
    "gpt_oss": frozenset({FULL, SLIDING}),
    "qwen2": frozenset({FULL, SLIDING}),
    "qwen3": frozenset({FULL, SLIDING}),
    "smollm3": frozenset({FULL, SLIDING}),
    "gemma2": frozenset({FULL, SLIDING}),
    "gemma3_text": frozenset({FULL, SLIDING}),
    "gemma4_text": frozenset({FULL, SLIDING}),
    "llama4_text": frozenset({FULL, CHUNKED}),
    "qwen3_next": frozenset({FULL, LINEAR}),
}
ZERO_CENTRED_NORMS = frozenset({"gemma3_text", "qwen3_next"})  # RMSNorm weights applied as (1 + w), init 0
ROPE_ON_SLIDING_ONLY = frozenset({"cohere2"})  # model types whose global layers are NoPE (see the module docstring)
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")


@dataclass(frozen=True)
class HFLayout:
    """What each layer of a transformers model does, as its config says (see the module docstring)."""

    types: tuple[str, ...]  # per layer: full_attention | sliding_attention | chunked_attention | ...
    rope: tuple[bool, ...]  # per layer: True when the layer rotates q and k (False: NoPE)
    window: int | None = None  # the sliding layers' window (None: no sliding layer)
    chunk: int | None = None  # the chunked layers' chunk size (None: no chunked layer)
    rope_types: tuple[str, ...] = ()  # layer types rope_parameters is nested by, in layer order (empty: one set)
    details: tuple[str, ...] = ()  # the attention details the model's modules have (`attention_details`)

    @property
    def global_types(self) -> tuple[str, ...]:
        """The layer types (in layer order) that attend over the whole context."""
        return tuple(dict.fromkeys(t for t in self.types if t not in LOCAL))

    @property
    def local_only(self) -> bool:
        """True when every layer attends within a window or a chunk (Mistral-7B-v0.1)."""
        return bool(self.types) and not self.global_types

    @property
    def mixed(self) -> bool:
        """True when the layers differ in attention type or in RoPE."""
        return len(set(self.types)) > 1 or len(set(self.rope)) > 1

    def rope_layer_types(self) -> tuple[str, ...]:
        """The layer types (in layer order) with at least one layer that rotates q and k."""
        return tuple(dict.fromkeys(t for t, r in zip(self.types, self.rope, strict=True) if r))

    def describe(self) -> str:
        """One line: "2 sliding_attention (window 8) + 1 full_attention; NoPE: layers 3; rope per layer type"."""
        counts = Counter(self.types)
        span = {SLIDING: self.window, CHUNKED: self.chunk}
        parts = []
        for t in dict.fromkeys(self.types):
            extra = f" ({'window' if t == SLIDING else 'chunk'} {span[t]})" if span.get(t) is not None else ""
            parts.append(f"{counts[t]} {t}{extra}")
        text = " + ".join(parts)
        nope = [str(i + 1) for i, r in enumerate(self.rope) if not r]
        if nope:
            text += f"; NoPE: layer{'s' if len(nope) > 1 else ''} {', '.join(nope)}"
        if self.rope_types:
            text += "; rope per layer type"
        return "; ".join([text, *self.details])


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _declares_layer_types(config: Any) -> bool:
    return "layer_types" in getattr(type(config), "__dataclass_fields__", {})


def hf_layout(config: Any) -> HFLayout:
    """The layout of a transformers (text) config object; see the module docstring for the rules."""
    n = int(getattr(config, "num_hidden_layers", 0) or 0)
    window = getattr(config, "sliding_window", None)
    window = int(window) if _positive_int(window) else None
    declared = getattr(config, "layer_types", None) if _declares_layer_types(config) else None
    if isinstance(declared, (list, tuple)) and len(declared) == n:
        types = tuple(str(t) for t in declared)
    else:
        types = (SLIDING if window is not None else FULL,) * n
    if SLIDING in types and window is None:  # a sliding type with no window attends globally in transformers
        types = tuple(FULL if t == SLIDING else t for t in types)
    chunk = getattr(config, "attention_chunk_size", None)
    chunk = int(chunk) if _positive_int(chunk) and CHUNKED in types else None
    no_rope = getattr(config, "no_rope_layers", None)
    if isinstance(no_rope, (list, tuple)) and len(no_rope) == n:
        rope = tuple(bool(x) for x in no_rope)
    elif str(getattr(config, "model_type", "")) in ROPE_ON_SLIDING_ONLY:
        rope = tuple(t == SLIDING for t in types)
    else:
        rope = tuple(t != LINEAR for t in types)
    params = getattr(config, "rope_parameters", None)
    nested = tuple(t for t in dict.fromkeys(types) if t in params) if isinstance(params, dict) else ()
    return HFLayout(
        types=types,
        rope=rope,
        window=window if SLIDING in types else None,
        chunk=chunk,
        rope_types=nested,
    )


def unread_layer_type(config: Any) -> str | None:
    """The first `layer_types` entry the model's forward has no mask for (`MASK_TYPES`), or None."""
    known = MASK_TYPES.get(str(getattr(config, "model_type", "")))
    declared = getattr(config, "layer_types", None) if _declares_layer_types(config) else None
    if known is None or not isinstance(declared, (list, tuple)):
        return None
    return next((str(t) for t in declared if t not in known), None)


_LAYER = re.compile(r"layers\.(\d+)\.")


def _layers_text(layers: list[int], n: int) -> str:
    """ "all layers" or "layers 2, 4" (1-based, as `HFLayout.describe` numbers them)."""
    if len(layers) == n:
        return "all layers"
    return f"layer{'s' if len(layers) > 1 else ''} {', '.join(str(i + 1) for i in layers)}"


def attention_details(model: nn.Module, config: Any) -> tuple[str, ...]:
    """The learned sinks, QK-norms, v-norm and output gate of a transformers model's attention layers, one phrase
    each ("learned sinks (H,): all layers"), from its modules (built on the meta device: only names and shapes are
    read). Empty for a model with none."""
    n = int(getattr(config, "num_hidden_layers", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    found: dict[str, list[int]] = {}
    for name, module in model.named_modules():
        m = _LAYER.search(name)
        if m is None or not name.endswith(("self_attn", "attention")):
            continue
        layer = int(m.group(1))
        head_dim = int(getattr(module, "head_dim", 0) or 0)  # the layer's own (Gemma 4's global layers differ)
        sinks = getattr(module, "sinks", None)
        if isinstance(sinks, nn.Parameter):
            found.setdefault(f"learned sinks ({', '.join(map(str, sinks.shape))},)", []).append(layer)
        found_norm = _qk_norm(module, config, head_dim)
        if found_norm is not None:
            found.setdefault(found_norm, []).append(layer)
        if getattr(module, "v_norm", None) is not None:
            found.setdefault("v-norm (weightless RMS per head)", []).append(layer)
        q_proj = getattr(module, "q_proj", None)
        if isinstance(q_proj, nn.Linear) and head_dim and q_proj.out_features == 2 * heads * head_dim:
            found.setdefault("sigmoid output gate (elementwise, in q_proj)", []).append(layer)
    return tuple(f"{what}: {_layers_text(sorted(set(layers)), n)}" for what, layers in found.items())


def _qk_norm(module: nn.Module, config: Any, head_dim: int) -> str | None:
    """What the q/k norm of one attention module is ("QK-norm: RMS per head, weight w"), or None (no norm)."""
    q_norm = getattr(module, "q_norm", None) or getattr(module, "qk_norm", None)
    if not isinstance(q_norm, nn.Module):
        return None
    weight = getattr(q_norm, "weight", None)
    if not isinstance(weight, nn.Parameter):
        return "QK-norm (weightless RMS per head)"
    span = "per head" if weight.shape[-1] == head_dim else f"over the projection ({weight.shape[-1]})"
    scale = "(1 + w)" if str(getattr(config, "model_type", "")) in ZERO_CENTRED_NORMS else "w"
    return f"QK-norm (RMS {span}, weight {scale})"


def _original_length(blocks: list[Any]) -> int | None:
    for block in blocks:
        if isinstance(block, dict) and _positive_int(block.get("original_max_position_embeddings")):
            return int(block["original_max_position_embeddings"])
    return None


def train_length(raw: dict[str, Any], layout: HFLayout | None) -> int | None:
    """The length a transformers checkpoint was trained at, from its config.json (`raw`) and layout.

    1. `original_max_position_embeddings` of the rope parameters the global layers use (nested ones: the global
       layer types' own, e.g. Gemma 3's "full_attention"; else the one set, or the config's top level): the length
       a RoPE scaling was set up from.
    2. A model whose every layer attends within a sliding window (or chunk) shorter than its context: the window
       (Mistral-7B-v0.1: 4096 of 32768), as microsoft/LongRoPE takes it (rope/__init__.py, lines 91-94, commit
       c9e56aa).
    3. Else the context size (`max_position_embeddings` or the architecture's name for it). A model that mixes
       windowed and global layers (Gemma 3: 5 sliding per 1 full; Qwen2 with `max_window_layers`) attends over
       this whole length in its global layers, so its window is not its training length.
    None when the config names no length (ALiBi models).
    """
    params, legacy = raw.get("rope_parameters"), raw.get("rope_scaling")
    if layout is not None and layout.rope_types and isinstance(params, dict):
        blocks = [params.get(t) for t in layout.global_types if t in layout.rope_types]
    else:
        blocks = [params, legacy, raw]
    original = _original_length(blocks)
    if original is not None:
        return original
    context = next((int(raw[k]) for k in LENGTH_KEYS if _positive_int(raw.get(k))), None)
    spans = [x for x in (layout.window, layout.chunk) if x is not None] if layout is not None else []
    if layout is not None and layout.local_only and spans and (context is None or min(spans) < context):
        return min(spans)
    return context
