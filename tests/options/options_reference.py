"""A direct re-implementation of a posenc model's forward with the model options, from the reference formulas
(docs/commands/model-options.md), on the model's own weights: explicit fp32 softmax, Conv1d for Canon, no posenc
kernel or hook.
For a scheme without a bias (nope, rope): the scheme's `rotate` is the one posenc call it makes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc_cli.model import GPT

EPS = 1e-6


def conv_reference(h: Tensor, weight: Tensor) -> Tensor:
    """PhysicsLM4's Canon: depthwise Conv1d, padding K − 1, the first T outputs kept, plus the residual."""
    T, C, K = h.shape[1], h.shape[2], weight.shape[-1]
    out = F.conv1d(h.transpose(1, 2), weight, padding=K - 1, groups=C)[..., :T]  # (B, C, T)
    return h + out.transpose(1, 2)


def rms(x: Tensor) -> Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def canon(block, placement: str, h: Tensor) -> Tensor:
    options = block.options
    if "canon" not in options or placement not in options["canon"].convs:
        return h
    return conv_reference(h, options["canon"].convs[placement].weight)


def attention(block, model: GPT, h: Tensor, ctx, window: int | None = None) -> Tensor:
    """The attention sublayer: h (B, T, D) -> (B, T, D), `window`: a sliding window of W keys (j > i − W)."""
    cfg, options, attn = model.config, block.options, block.attn
    B, T, D = h.shape
    H, hd = cfg.n_head, cfg.head_dim
    q, k, v = attn.qkv(h).split(D, dim=2)
    q, k, v = (t.view(B, T, H, hd) for t in (q, k, v))  # (B, T, H, hd)
    qk_norm = dict(options.items()).get("qk_norm")
    if qk_norm is not None and qk_norm.kind == "rms":  # Qwen3: weighted RMSNorm per head, before RoPE
        q, k = rms(q) * qk_norm.q_weight, rms(k) * qk_norm.k_weight
    qkv = canon(block, "b", torch.cat([q, k, v], dim=2).reshape(B, T, 3 * D))  # concat[q, k, v] (B, T, 3D)
    q, k, v = (t.transpose(1, 2) for t in qkv.view(B, T, 3 * H, hd).split(H, dim=2))  # (B, H, T, hd)
    view = model.scheme.layer_view(block.attn.layer, ctx)
    q, k = view.scheme.rotate(q, k, view.ctx)
    if qk_norm is not None and qk_norm.kind == "l2":  # Llama 4: weightless, after RoPE
        q, k = rms(q), rms(k)
    s = q @ k.transpose(-1, -2) / hd**0.5  # (B, H, T, T)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    hidden = (j > i) if window is None else (j > i) | (j <= i - window)
    s = s.masked_fill(hidden, float("-inf"))
    if "attn_sinks" in options:  # GPT-OSS: the sink logit appended after scale and mask, its column dropped
        sink = options["attn_sinks"].sinks.view(1, H, 1, 1).expand(B, H, T, 1)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :T]
    else:
        p = torch.softmax(s, dim=-1)
    y = (p @ v).transpose(1, 2)  # (B, T, H, hd)
    if "attn_gate" in options:  # Qiu et al.: σ(X W_θ) on the per-head output, X the attention's input
        y = y * torch.sigmoid(options["attn_gate"].proj(h).view(B, T, H, -1))
    return attn.proj(y.reshape(B, T, D))


def mlp(block, h: Tensor) -> Tensor:
    m = block.mlp
    return m.proj(m.act(canon(block, "d", m.fc(h))))


def reference_logits(model: GPT, idx: Tensor, windows: list[int | None] | None = None) -> Tensor:
    """idx (B, T) -> logits (B, T, V); `windows`: per layer, a sliding window or None (full)."""
    ctx = model.context(idx)
    x = model.wte(idx)
    for n, block in enumerate(model.blocks):
        h = canon(block, "a", block.norm1(x))
        x = x + attention(block, model, h, ctx, None if windows is None else windows[n])
        x = x + mlp(block, canon(block, "c", block.norm2(x)))
    return model.lm_head(model.norm_f(x))
