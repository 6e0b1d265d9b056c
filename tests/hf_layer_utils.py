"""Tiny random `transformers` models with per-layer layouts (Gemma 3 text, SmolLM3, Qwen2 with sliding windows,
Mistral, Llama 4 text), saved with the tiny tokenizer of `hf_utils`, for the hf_layers and hf_extend tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from hf_utils import tiny_tokenizer

CONTEXT = 32  # max_position_embeddings of every tiny model
WINDOW = 8  # sliding window of the windowed layers
LAYERED = ("gemma3", "smollm3", "qwen2_swa", "mistral", "llama4")


def layered_config(arch: str, vocab: int, **extra: Any) -> Any:
    """A 2-4 layer, d = 32 config of `arch` (see `LAYERED`) whose layers differ in attention span or RoPE."""
    import transformers as tf

    common = {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": CONTEXT, "bos_token_id": 0, "eos_token_id": 0,
              "pad_token_id": 0, "initializer_range": 0.1}  # fmt: skip
    if arch == "gemma3":  # 2 local layers (base 1e4) per global one (base 1e6), as Gemma 3's 5:1 at tiny scale
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}}  # fmt: skip
        fields = {"num_hidden_layers": 3, "head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": WINDOW,
                  "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
                  "rope_parameters": rope}  # fmt: skip
        return tf.Gemma3TextConfig(**{**common, **fields, **extra})
    if arch == "smollm3":  # NoPE in every 4th layer (no_rope_layers: 1 = RoPE)
        return tf.SmolLM3Config(**{**common, "num_hidden_layers": 4, "no_rope_layers": [1, 1, 1, 0], **extra})
    if arch == "qwen2_swa":  # layers from max_window_layers on slide: layer 0 global, layers 1-2 windowed
        fields = {"num_hidden_layers": 3, "use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}
        return tf.Qwen2Config(**{**common, **fields, **extra})
    if arch == "mistral":  # every layer windowed (Mistral-7B-v0.1's layout)
        return tf.MistralConfig(**{**common, "num_hidden_layers": 2, "sliding_window": WINDOW, **extra})
    if arch == "llama4":  # iRoPE: chunked RoPE layers, every 2nd layer NoPE and global; dense MLPs
        fields = {"num_hidden_layers": 2, "head_dim": 8, "intermediate_size_mlp": 64, "no_rope_layer_interval": 2,
                  "attention_chunk_size": WINDOW, "moe_layers": [], "num_local_experts": 1}  # fmt: skip
        return tf.Llama4TextConfig(**{**common, **fields, **extra})
    raise ValueError(arch)


def save_layered_model(directory: Path, arch: str, *, seed: int = 0, **extra: Any) -> Path:
    """Random weights of a tiny `arch` model (see `layered_config`) plus the tiny tokenizer, into `directory`."""
    import transformers as tf

    tok = tiny_tokenizer()
    cfg = layered_config(arch, len(tok), **extra)
    torch.manual_seed(seed)
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(str(directory))
    tok.save_pretrained(str(directory))
    return Path(directory)


class LazyModels(dict):
    """{arch: directory}, each tiny model saved under `root` on first use (a test pays only for those it reads)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, arch: str) -> Path:
        self[arch] = save_layered_model(self.root / arch, arch)
        return self[arch]
