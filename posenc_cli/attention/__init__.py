"""Causal multi-head self-attention with the positional hooks: kernels apart from the layer, chosen once per forward.

- `layer.CausalSelfAttention`: the module (QKV projection, the scheme's `rotate` on q and k, the length scale,
  output projection). It names no road: it calls `choose.attend`, which takes the forward's kernel and calls it.
- `state.AttentionState`: what one forward's layers share (scheme, position context, the tensors built once: a
  key-only bias, shared masks, length-scale factors) as typed fields, and the kernels chosen for it; `state.Kernel`,
  the interface of every road.
- `choose.choose_kernel(KernelSpec)`: a pure function from the facts (`spec.KernelSpec`: the scheme's hooks, q's
  dtype, device, gradient and shape, causal, the KV cache's first query row, forced chunking, the layer's span) to
  a kernel; `choose.describe` gathers them, `choose.forward_kernel` keeps one per spec and forward. The device
  and memory policy (`BIAS_CHUNK_BYTES`, `KEY_BIAS_DEVICES`, `FP32_GRAD_DEVICES`) lives there.
- `kernels`: the roads, one class each with one interface, `kernel(q, k, v, state, layer)`: fused SDPA, the
  key-bias road, a shared mask, the chunked bias road, query rows for the KV cache, position remapping, and the
  fp32 wrapper for bf16 training on CPU; `flex.Flex`, FlexAttention with the scheme's `score_mod` and a block mask
  (taken where `choose.FLEX_MIN_LEN` lists the device and dtype). Memory stays bounded when a scheme adds a score
  bias (query chunks of `BIAS_CHUNK_BYTES`).

- `windowed`: a layer whose span (`positional.span`, given per layer by a hybrid) is a sliding window or fixed
  chunks: `Windowed` (query chunks scored against the keys they can see) and `BlockCausal` (the blocks as a batch
  through the fused kernel). `KernelSpec.span` records the span where it hides keys at that length.

A layer attends with its `LayerView` (`positional.base`): the scheme, context, span and temperature a hybrid gives
it; `GPT.layer_attention` builds one `AttentionState` per distinct scheme and context, so layers of one scheme share
tables and kernel choices. Where the next schemes plug in: a scheme that owns the normaliser (stick-breaking, a
forget gate's bias) declares it as a hook the spec records, and `choose_kernel` routes it to a kernel that calls the
scheme, before every fused road.
"""

from __future__ import annotations

from posenc_cli.attention.choose import (
    BIAS_CHUNK_BYTES,
    FLEX_GRAD_DEVICES,
    FLEX_MIN_LEN,
    FP32_GRAD_DEVICES,
    FP32_GRAD_MAX_LEN,
    KEY_BIAS_DEVICES,
    attend,
    bias_chunk_size,
    choose_kernel,
    describe,
    flex_applies,
    remap_applies,
)
from posenc_cli.attention.flex import Flex
from posenc_cli.attention.kernels import attend_key_bias, fold_causal_mask, merged_scores
from posenc_cli.attention.layer import CausalSelfAttention
from posenc_cli.attention.scale import logn_factor, ssmax_factor
from posenc_cli.attention.spec import KernelSpec
from posenc_cli.attention.state import AttentionState, Kernel

__all__ = [
    "BIAS_CHUNK_BYTES",
    "FLEX_GRAD_DEVICES",
    "FLEX_MIN_LEN",
    "FP32_GRAD_DEVICES",
    "FP32_GRAD_MAX_LEN",
    "KEY_BIAS_DEVICES",
    "AttentionState",
    "CausalSelfAttention",
    "Flex",
    "Kernel",
    "KernelSpec",
    "attend",
    "attend_key_bias",
    "bias_chunk_size",
    "choose_kernel",
    "describe",
    "flex_applies",
    "fold_causal_mask",
    "logn_factor",
    "merged_scores",
    "remap_applies",
    "ssmax_factor",
]
