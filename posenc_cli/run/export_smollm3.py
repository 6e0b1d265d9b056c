"""posenc's RMSNorm block as `transformers`' SmolLM3 (`SmolLM3ForCausalLM`), exactly: plain RoPE runs and per-layer
layouts of RoPE and NoPE layers with full or sliding-window attention (pos=rope|smollm3|rnope-swa|layout).

`posenc export` takes this road for RMSNorm RoPE runs and every layout (`run.export.architecture`);
`check_smollm3_exportable` says what maps.

Why SmolLM3, and why only `model.norm=rmsnorm` (transformers 5.24, `models/*/modeling_*.py`):
- posenc's block is x + attn(norm(x)), then x + mlp(norm(x)); attention with q, k, v and output biases; MLP
  proj(GELU(fc(x))) with biases (exact-erf GELU); a final norm; the LM head tied to the token embedding.
- No architecture with per-layer NoPE or sliding layers uses a LayerNorm with a bias in a sequential block: Gemma 3,
  Qwen2, Mistral, SmolLM3 and Llama 4 use RMSNorm, Cohere 2 a bias-free LayerNorm (`Cohere2LayerNorm`) in a parallel
  block (`Cohere2DecoderLayer`: residual + attention + MLP of one normed input). A LayerNorm run has no exact target.
- SmolLM3 (`SmolLM3Config`): RMSNorm x·rsqrt(mean x² + eps)·w, as torch's `nn.RMSNorm`; `attention_bias` puts biases
  on q, k, v and o; `mlp_bias` on its gated MLP down(act(gate(x)) · up(x)), which holds posenc's MLP exactly with
  gate = fc, up = 0·x + 1 (zero weight, unit bias) and `hidden_act="gelu"`; `no_rope_layers` (1 = RoPE) gives each
  layer RoPE or NoPE; explicit `layer_types` with `use_sliding_window` gives each layer a sliding window (its own
  default puts windows on the NoPE layers only; an explicit list is used as given). RoPE is rotate_half over the
  whole head (`apply_rotary_pos_emb`), one set of rope parameters for every RoPE layer.
- The up projection costs d·ffn extra weights (all zero) and the same in FLOPs: the price of exactness.
- Not holdable, and refused: chunked attention and query temperatures (Llama 4 has them, but its MLP has no biases,
  `Llama4TextMLP`, so up(x) = 1 is impossible), RoPE layers that differ in base or scaling (Gemma 3's per-layer-type
  rope parameters; its block has (1 + w) sandwich norms, QK-norm and a √d embedding scale), partial rotary, p-RoPE,
  position remaps, attention-logit scaling, the fairseq embedding scale.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from posenc_cli.config import Config
from posenc_cli.errors import NotExportable
from posenc_cli.positional.layout import default_window
from posenc_cli.positional.rope import RopeConfig, rotary_dim
from posenc_cli.run.export_rope import interleaved_to_half, neox_rope

__all__ = ["check_smollm3_exportable", "smollm3_config_kwargs", "smollm3_layers", "smollm3_weights"]

ARCHITECTURE = "SmolLM3ForCausalLM"


def smollm3_layers(
    cfg: Config, target: str = ARCHITECTURE
) -> tuple[list[str], list[int], int | None, RopeConfig | None]:
    """(layer_types, no_rope_layers, sliding window or None, the RoPE layers' one config or None) of a run, or
    `NotExportable` (one line) for what SmolLM3 cannot hold (see the module docstring), naming `target`
    (an architecture with SmolLM3's block: Granite SWA too)."""
    n = cfg.model.n_layer
    if isinstance(cfg.pos, RopeConfig):
        return ["full_attention"] * n, [1] * n, None, cfg.pos
    if not hasattr(cfg.pos, "layer_entries"):
        raise NotExportable(f"not exportable: pos={cfg.pos.name} has no counterpart in {target}")
    entries = cfg.pos.layer_entries(n)
    types, rope, windows, ropes = [], [], set(), []
    for i, e in enumerate(entries):
        if e.pos.name not in ("rope", "nope"):
            raise NotExportable(f"not exportable: layer {i} uses pos={e.pos.name}; {target} has RoPE or NoPE")
        if e.span == "chunked" or e.temperature:
            what = "chunked attention" if e.span == "chunked" else "a query temperature"
            raise NotExportable(f"not exportable: layer {i} has {what}, which {target} does not (Llama 4 does, "
                                "but its MLP has no biases to hold posenc's)")  # fmt: skip
        types.append("sliding_attention" if e.span == "sliding" else "full_attention")
        rope.append(int(e.pos.name == "rope"))
        if e.span == "sliding":  # a run's config holds its windows; an unresolved config the default one
            windows.add(int(e.window) if e.window is not None else default_window(cfg.pos, cfg.train.seq_len))
        if isinstance(e.pos, RopeConfig):
            ropes.append(e.pos)
    if len(windows) > 1:
        raise NotExportable(f"not exportable: sliding windows of {sorted(windows)} tokens; {target} has one")
    if any(r != ropes[0] for r in ropes):
        raise NotExportable(
            f"not exportable: the RoPE layers differ in their options (base, scaling); {target} has one set "
            "of rope parameters (Gemma 3 has one per layer type, but not posenc's block)"
        )
    return types, rope, (windows.pop() if windows else None), (ropes[0] if ropes else None)


def check_smollm3_exportable(cfg: Config, target: str = ARCHITECTURE) -> None:
    """Raise `NotExportable` (one line) unless the run maps exactly onto SmolLM3's block (see the module
    docstring); the message names `target`, SmolLM3 or an architecture with its block (Granite SWA)."""
    if cfg.model.norm != "rmsnorm":
        raise NotExportable(
            f"not exportable as {target}: model.norm={cfg.model.norm}; no transformers architecture with "
            "per-layer NoPE or windows holds posenc's LayerNorm block (they use RMSNorm, or Cohere 2's parallel "
            "block); train with model.norm=rmsnorm"
        )
    if cfg.model.attn_scale != "none" or cfg.model.embedding != "gpt2":
        what = f"model.attn_scale={cfg.model.attn_scale}" if cfg.model.attn_scale != "none" else "model.embedding"
        raise NotExportable(f"not exportable: {what} has no counterpart in {target}")
    _, _, _, rope = smollm3_layers(cfg, target)
    if rope is not None:
        if rope.p != 1.0 or rope.remap.active:
            raise NotExportable(f"not exportable: p-RoPE or a position remap has no counterpart in {target}")
        if rotary_dim(cfg.model.head_dim, rope.rotary_fraction) != cfg.model.head_dim:
            raise NotExportable(f"not exportable: partial rotary; {target} rotates the whole head")


def smollm3_config_kwargs(cfg: Config, vocab_size: int, eod_id: int) -> dict[str, Any]:
    """Keyword arguments of `SmolLM3Config` for a run `check_smollm3_exportable` accepts."""
    m = cfg.model
    types, no_rope, window, rope = smollm3_layers(cfg)
    scaling, base, _, max_pos = neox_rope(rope, m.head_dim, cfg.train.seq_len) if rope else (None, 1e4, 1.0, 0)
    return {
        "vocab_size": vocab_size,
        "hidden_size": m.d_model,
        "intermediate_size": m.mlp_ratio * m.d_model,
        "num_hidden_layers": m.n_layer,
        "num_attention_heads": m.n_head,
        "num_key_value_heads": m.n_head,
        "hidden_act": "gelu",  # exact erf GELU, as nn.GELU()
        "max_position_embeddings": max_pos or cfg.train.seq_len,
        "rms_norm_eps": 1e-5,  # nn.RMSNorm(eps=1e-5) in posenc_cli/model.py
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": base, **(scaling or {})},
        "attention_bias": True,
        "mlp_bias": True,
        "no_rope_layers": no_rope,
        "layer_types": types,
        "use_sliding_window": window is not None,
        "sliding_window": window,
        "attention_dropout": m.dropout,
        "initializer_range": m.init_std,
        "bos_token_id": eod_id,
        "eos_token_id": eod_id,
        "pad_token_id": None,
    }


def _bias(state: dict[str, Tensor], name: str, rows: int, like: Tensor) -> Tensor:
    """`state[name]`, or zeros (a bias=False run: adding zeros is exact)."""
    return state[name] if name in state else torch.zeros(rows, dtype=like.dtype)


def smollm3_weights(state: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    """posenc state dict -> SmolLM3ForCausalLM state dict (the LM head tied, not stored)."""
    m = cfg.model
    D, hd = m.d_model, m.head_dim
    _, _, _, rope = smollm3_layers(cfg)
    rows = torch.arange(D).view(m.n_head, hd)  # (H, hd): the q or k row of (head, dim)
    if rope is not None and rope.layout == "interleaved":  # pair (2k, 2k+1) -> (k, k + hd/2): the same rotation
        rows = rows[:, interleaved_to_half(hd)]
    qk_rows = rows.reshape(-1)
    out = {"model.embed_tokens.weight": state["wte.weight"], "model.norm.weight": state["norm_f.weight"]}
    for i in range(m.n_layer):
        src, dst = f"blocks.{i}", f"model.layers.{i}"
        w = state[f"{src}.attn.qkv.weight"]  # (3D, D): rows [q | k | v]
        b = _bias(state, f"{src}.attn.qkv.bias", 3 * D, w)
        for j, name in enumerate("qkv"):
            order = qk_rows if name != "v" else torch.arange(D)  # v is never rotated
            out[f"{dst}.self_attn.{name}_proj.weight"] = w[j * D : (j + 1) * D][order]
            out[f"{dst}.self_attn.{name}_proj.bias"] = b[j * D : (j + 1) * D][order]
        proj = state[f"{src}.attn.proj.weight"]
        out[f"{dst}.self_attn.o_proj.weight"] = proj
        out[f"{dst}.self_attn.o_proj.bias"] = _bias(state, f"{src}.attn.proj.bias", D, proj)
        out[f"{dst}.input_layernorm.weight"] = state[f"{src}.norm1.weight"]
        out[f"{dst}.post_attention_layernorm.weight"] = state[f"{src}.norm2.weight"]
        fc = state[f"{src}.mlp.fc.weight"]  # (ffn, D)
        out[f"{dst}.mlp.gate_proj.weight"] = fc
        out[f"{dst}.mlp.gate_proj.bias"] = _bias(state, f"{src}.mlp.fc.bias", fc.shape[0], fc)
        out[f"{dst}.mlp.up_proj.weight"] = torch.zeros_like(fc)  # up(x) = 1: down(GELU(fc x) · 1)
        out[f"{dst}.mlp.up_proj.bias"] = torch.ones(fc.shape[0], dtype=fc.dtype)
        down = state[f"{src}.mlp.proj.weight"]
        out[f"{dst}.mlp.down_proj.weight"] = down
        out[f"{dst}.mlp.down_proj.bias"] = _bias(state, f"{src}.mlp.proj.bias", D, down)
    return out
