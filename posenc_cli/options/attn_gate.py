"""Output-gated attention (Qiu et al. 2025, arXiv 2505.06708; qiuzh20/gated_attention `modeling_qwen3.py`).

Y' = Y ⊙ σ(X W_θ) on the attention output per head, before the output projection; X is the attention's input (the
block's hidden state after its pre-norm, what the reference's q_proj reads). `elementwise`: one gate per channel,
W_θ (D, H·hd) (Qwen3-Next; the reference's q_proj emits H·2d); `headwise`: one per head, W_θ (D, H) (the reference's
H scalars). A separate projection `blocks.<i>.options.attn_gate.proj` (porting from the reference or Qwen3-Next
takes its rows out of q_proj), initialised as every linear, N(0, `model.init_std`), so σ starts near 0.5.
No kernel is concerned: the gate acts on the kernel's output.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc_cli.config import ModelConfig
from posenc_cli.options import register
from posenc_cli.options.base import ModelOption
from posenc_cli.positional.base import PositionalScheme


def gated(y: Tensor, gate_logits: Tensor) -> Tensor:
    """y (B, T, H, hd) times σ(gate_logits), (B, T, H, hd) elementwise or (B, T, H, 1) per head."""
    return y * torch.sigmoid(gate_logits)


@register
class AttnGate(ModelOption):
    """`model.attn_gate=elementwise|headwise`: the sigmoid output gate of this layer."""

    name = "attn_gate"
    paper = "gated attention (Qiu et al. 2025, arXiv 2505.06708; Qwen3-Next)"
    order = 30
    samples = ("elementwise", "headwise")

    def __init__(self, cfg: ModelConfig, layer: int, scheme: PositionalScheme) -> None:
        super().__init__(cfg, layer, scheme)
        width = cfg.d_model if cfg.attn_gate == "elementwise" else cfg.n_head
        self.proj = nn.Linear(cfg.d_model, width, bias=cfg.bias)
        self.n_head = cfg.n_head

    def output(self, y: Tensor, x: Tensor) -> Tensor:
        B, T, H, _ = y.shape
        return gated(y, self.proj(x).view(B, T, H, -1))  # gate (B, T, H, hd) or (B, T, H, 1)
