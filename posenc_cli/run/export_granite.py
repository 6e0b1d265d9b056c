"""posenc's RMSNorm block with learned attention sinks (`model.attn_sinks`, `pos=gpt-oss`) as `transformers`'
Granite SWA (`GraniteSWAForCausalLM`), exactly; and why the other model options have no exact target.

Granite SWA (transformers 5.25, `models/granite_swa/`) is SmolLM3's block plus a sink: RMSNorm pre-norm
(x·rsqrt(mean x² + eps)·w), q, k, v and o biases (`attention_bias`), a gated MLP with biases (`mlp_bias`; posenc's
GELU MLP is held as in `export_smollm3`, gate = fc, up = 0·x + 1), one learned logit per head `self_attn.sinks`
(H,) on every layer joined to the softmax as σ(logsumexp − b_h) on the output (`eager_attention_forward`: the same
weights as posenc's `sink_softmax`), `layer_types` (full or sliding, one window) and `layer_rope_theta` (a base per
layer, 0 = NoPE) over one set of rope parameters. Its multipliers are set to posenc's: embedding, residual and
logits 1, attention 1/√hd. So a run that `export_smollm3` holds, plus sinks, is Granite SWA; the layer list and the
weights are SmolLM3's (`smollm3_layers`, `smollm3_weights`) with the sinks added.

The other options (`option_refusal`), from the modeling files of transformers 5.25:
- `qk_norm=rms`: Qwen3, Qwen3-Next, Gemma 3/4 and OLMo 2 have no MLP biases (`Qwen3MLP`: bias=False), so
  GELU(fc·x + b) cannot be held; those with per-head RMS QK-norm and MLP biases (HY-V3, Step 3.7, Doge) use one
  `rms_norm_eps` for the block norms and the QK-norm, where posenc uses 1e-5 and 1e-6.
- `qk_norm=l2`: Llama 4 (`Llama4TextWeightlessRMSNorm`) has no MLP biases (`Llama4TextMLP`), and its eps is its
  block norms' too.
- `attn_gate`: Qwen3-Next's gate (q_proj twice as wide) sits in a block without biases, with (1 + w) norms and a
  MoE MLP; no architecture gates headwise.
- `canon`: no architecture has Canon layers (Qwen3-Next's depthwise conv runs on its linear-attention q, k, v with
  SiLU and no residual).
- GPT-OSS itself, the sinks' origin, cannot hold posenc's MLP: its experts compute (up + 1)·g·σ(1.702·g) with g and
  up clamped to 7, not the exact-erf GELU.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from posenc_cli.config import Config
from posenc_cli.options import enabled as enabled_options
from posenc_cli.run.export_smollm3 import (
    check_smollm3_exportable,
    smollm3_config_kwargs,
    smollm3_layers,
    smollm3_weights,
)

__all__ = ["ARCHITECTURE", "granite_config_kwargs", "granite_weights", "option_refusal", "takes_granite"]

ARCHITECTURE = "GraniteSWAForCausalLM"
# Why each option other than attn_sinks has no exact target (see the module docstring), one line each.
NO_TARGET = {
    "qk_norm": "Qwen3, Gemma 3/4, Llama 4 and Qwen3-Next have no MLP biases to hold posenc's GELU MLP, and the "
    "architectures with QK-norm and MLP biases (HY-V3, Step 3.7, Doge) use one rms_norm_eps for block and QK norms "
    "(posenc: 1e-5 and 1e-6)",
    "attn_gate": "Qwen3-Next, the one architecture with an output gate, has no attention or MLP biases and "
    "(1 + w) norms",
    "canon": "no transformers architecture has Canon layers",
}


def option_refusal(cfg: Config) -> str | None:
    """The one-line reason a run's model options cannot be exported (None: none, or only sinks on a block Granite
    SWA holds, which `check_granite_exportable` then checks)."""
    names = [cls.name for cls in enabled_options(cfg.model)]
    for name in names:
        if name in NO_TARGET:
            return (
                f"not exportable: model.{name}={getattr(cfg.model, name)} has no exact counterpart: {NO_TARGET[name]}"
            )
    if "attn_sinks" in names and cfg.model.norm != "rmsnorm":
        return (
            f"not exportable: model.attn_sinks=True with model.norm={cfg.model.norm}: {ARCHITECTURE}, the architecture "
            "with sinks and biases, uses RMSNorm (GPT-OSS's experts compute a clamped (up + 1)·g·σ(1.702·g), not "
            "GELU); train with model.norm=rmsnorm"
        )
    return None


def takes_granite(cfg: Config) -> bool:
    """True for a run with learned sinks (the only option Granite SWA holds)."""
    return bool(cfg.model.attn_sinks)


def check_granite_exportable(cfg: Config) -> None:
    """Raise `NotExportable` (one line) unless the run's block, layers and rope parameters map onto Granite SWA:
    SmolLM3's checks, naming Granite SWA (`option_refusal` has passed the options already)."""
    check_smollm3_exportable(cfg, target=ARCHITECTURE)


def granite_config_kwargs(cfg: Config, vocab_size: int, eod_id: int) -> dict[str, Any]:
    """Keyword arguments of `GraniteSWAConfig` for a run `check_granite_exportable` accepts."""
    kwargs = smollm3_config_kwargs(cfg, vocab_size, eod_id)
    _, no_rope, window, _ = smollm3_layers(cfg)
    theta = float(kwargs["rope_parameters"]["rope_theta"])
    for key in ("no_rope_layers", "use_sliding_window"):
        kwargs.pop(key)
    return {
        **kwargs,
        "sliding_window": window,
        "layer_rope_theta": [theta if r else 0.0 for r in no_rope],  # 0: NoPE
        "embedding_multiplier": 1.0,
        "residual_multiplier": 1.0,
        "logits_scaling": 1.0,
        "attention_multiplier": 1.0 / math.sqrt(cfg.model.head_dim),
    }


def granite_weights(state: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    """posenc state dict -> GraniteSWAForCausalLM state dict: SmolLM3's names plus each layer's sinks (H,)."""
    out = smollm3_weights(state, cfg)
    for i in range(cfg.model.n_layer):
        out[f"model.layers.{i}.self_attn.sinks"] = state[f"blocks.{i}.options.attn_sinks.sinks"]
    return out
