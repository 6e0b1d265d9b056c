"""Learned attention sinks (GPT-OSS; OpenAI 2025, arXiv 2508.10925): one logit b_h per head joins every softmax row.

p_ij = exp(s_ij) / (exp(b_h) + Σ_{visible j'} exp(s_ij')), o_i = Σ_j p_ij v_j: the sink has no value, so a row's
weights sum to σ(ℓ_i − b_h) < 1 (ℓ_i the log-sum-exp of its visible logits) and a head may attend to nothing. The
logit is appended after the 1/√hd scale, the scheme's bias and the masks: never scaled, never masked, so sliding and
chunked layers keep it (transformers `models/gpt_oss/modeling_gpt_oss.py:225-254`; `sinks` of shape (H,) on every
layer, initialised N(0, 0.02) = N(0, `model.init_std`), :283, :405).

Which kernels run it: only the roads that compute the weights themselves (`attention.scored.Scored`, and
`kernels.Remapped` for Self-Extend / ReRoPE) append the column (`sink_softmax`); SDPA returns no log-sum-exp, so
`attention.choose.choose_kernel` sends a layer with sinks to `Scored` instead of every fused road. A scheme that
replaces the softmax (stick-breaking) has no normaliser to add a logit to and is refused.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc_cli.config import ModelConfig
from posenc_cli.errors import ConfigError
from posenc_cli.options import register
from posenc_cli.options.base import ModelOption
from posenc_cli.positional.base import PositionalScheme


def sink_softmax(logits: Tensor, sinks: Tensor) -> Tensor:
    """logits (B, H, Tq, Tk), −inf where a key is hidden, sinks (H,) -> weights (B, H, Tq, Tk): the softmax over each
    row and its head's sink logit, the sink's column dropped (each row sums to σ(ℓ − b_h))."""
    B, H, Tq, _ = logits.shape
    column = sinks.to(logits.dtype).view(1, H, 1, 1).expand(B, H, Tq, 1)  # (B, H, Tq, 1)
    return torch.softmax(torch.cat([logits, column], dim=-1), dim=-1)[..., :-1]


@register
class AttnSinks(ModelOption):
    """`model.attn_sinks=true`: the learned (H,) sink logits of this layer (`blocks.<i>.options.attn_sinks.sinks`)."""

    name = "attn_sinks"
    paper = "GPT-OSS learned attention sinks (arXiv 2508.10925; transformers gpt_oss)"
    order = 20
    off = False
    samples = (True,)

    def __init__(self, cfg: ModelConfig, layer: int, scheme: PositionalScheme) -> None:
        super().__init__(cfg, layer, scheme)
        if "normalise" in scheme.hooks:
            raise ConfigError(f"model.attn_sinks: scheme '{scheme.name}' (layer {layer}) replaces the softmax, so "
                              "there is no normaliser for a sink logit to join")  # fmt: skip
        self.sinks = nn.Parameter(torch.randn(cfg.n_head) * cfg.init_std)  # (H,)

    def sink_logits(self) -> Tensor:
        return self.sinks
