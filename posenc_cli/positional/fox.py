"""FoX, the Forgetting Transformer: a forget gate per head and token, its log summed into the scores (Lin et al.,
ICLR 2025, arXiv 2503.02130, Eq. 6-7).

f_t = σ(w_fᵀ x_t + b_f) per head, from the layer's input x_t, and logits_ij += D_ij = Σ_{l=j+1..i} log f_l = c_i − c_j
with c = cumsum(log f) over token order. A query thus discounts a key by every gate between them: the scheme learns
how fast each head forgets, and how that depends on the content.

Following the reference (zhixuan-lin/forgetting-transformer, `src/forgetting_transformer/model/
forgetting_transformer/modeling_forgetting_transformer.py`, `ForgettingAttentionLayer`): one `fgate_proj`
Linear(hidden, n_head, bias=True) per layer, weights N(0, initializer_range) and bias 0 (`_initialize_weights`;
`fgate_type="full"`, `fgate_bias_init=False`), so every gate starts near σ(0) = 1/2; log f is taken in fp32
(`logsigmoid(fgate_logit.float())`); the KV cache keeps each token's log f beside its key and value
(`FgateDynamicCache`), which is what the `content` hook's features are here. RoPE is off by default (`use_rope=False`);
`pos.rope=true` adds posenc's RoPE (its defaults, base 10k; the reference's base is 500k) for "FoX with RoPE".
`pos.decay_time_min/max` (off by default) start the gate's bias open (`gate_bias_init`), a posenc option.
posenc's choices: the gate reads the layer's normed input, as every projection of posenc's attention does, and is
computed in fp32 also under autocast; posenc's init std is `model.init_std` (0.02, the reference's default too).

Precision of the bias: c is summed in float64, and each chunk subtracts c at its last query before rounding to fp32,
so the near pairs that carry the softmax weight keep their digits at any length (far pairs are large and negative).

Position ids: FoX ignores them. Its discount counts the tokens between query and key in token order, as causality
does, so it is trivially `relative` (with `pos.rope=true` RoPE reads the ids as it always does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional import register
from posenc_cli.positional.base import Hook, PositionalScheme, PositionContext
from posenc_cli.positional.rope import RoPE, RopeConfig


@dataclass(kw_only=True)
class FoxConfig(PosConfig):
    name: str = "fox"
    rope: bool = False  # FoX with RoPE (posenc's RoPE at its defaults) besides the forget gate
    # Decay-time start of the gates' bias (0, 0: bias 0, every gate near 1/2, the reference's data-dependent gate):
    # head h of n starts with log f = −1/T_h, T log-uniform over [min, max] (`gate_bias_init`).
    decay_time_min: float = 0.0
    decay_time_max: float = 0.0

    def validate(self) -> None:
        times = (self.decay_time_min, self.decay_time_max)
        if times != (0.0, 0.0) and not 0 < self.decay_time_min <= self.decay_time_max:
            raise ConfigError(
                f"pos.decay_time_min={self.decay_time_min}, pos.decay_time_max={self.decay_time_max}: both 0 (the "
                "reference's gates at 1/2), or 0 < min <= max (tokens)"
            )


def gate_bias_init(n_head: int, decay_time_min: float, decay_time_max: float) -> Tensor:
    """(n_head,) forget-gate biases b_h = −log(exp(1/T_h) − 1), so that log σ(b_h) = −1/T_h, T_h log-uniform over
    [min, max]: the reference's `fgate_bias_init` (zhixuan-lin/forgetting-transformer, `ForgettingAttentionLayer`,
    decay_time_min/max), which it allows only for its data-independent gates ("bias_only", "fixed"); here it starts
    the data-dependent gate's bias, a posenc option (off by default) to test whether FoX's local start decides what
    it learns. Zeros when both are 0."""
    if decay_time_min == decay_time_max == 0:
        return torch.zeros(n_head)
    times = torch.logspace(math.log10(decay_time_min), math.log10(decay_time_max), n_head, dtype=torch.float64)
    return (-torch.log(torch.expm1(1.0 / times))).float()  # (H,)


def log_forget_gates(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """x (B, T, D), weight (H, D), bias (H,) -> log f (B, H, T, 1) fp32, log σ(w·x_t + b) per head."""
    with torch.autocast(x.device.type, enabled=False):
        logit = x.float() @ weight.float().t() + bias.float()  # (B, T, H)
        return F.logsigmoid(logit).transpose(1, 2)[..., None]  # (B, H, T, 1)


def forget_bias(log_f: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """log f (B, H, T, 1) of all tokens, q_pos (Tq,), k_pos (Tk,) token indexes -> (B, H, Tq, Tk) fp32
    D_ij = c_i − c_j, c = cumsum(log f) (the sum of log f over the tokens j+1..i where j ≤ i)."""
    c = log_f[..., 0].double().cumsum(-1)  # (B, H, T)
    ref = c[..., q_pos[-1:]]  # (B, H, 1): the chunk's last query
    cq = (c[..., q_pos] - ref).float()  # (B, H, Tq)
    ck = (c[..., k_pos] - ref).float()  # (B, H, Tk)
    return cq[..., :, None] - ck[..., None, :]


@register
class FoX(PositionalScheme):
    name = "fox"
    config_cls = FoxConfig
    hooks: tuple[Hook, ...] = ("content", "bias")
    paper = "Lin et al. 2025, arXiv:2503.02130"
    relative = True  # the gates follow token order; RoPE, when on, is relative too
    causal_only = True  # a key's discount is the gates between it and the query

    def __init__(self, cfg: FoxConfig, model: ModelConfig, train_length: int) -> None:
        super().__init__(cfg, model, train_length)
        self.gate_weight = nn.Parameter(torch.randn(model.n_layer, model.n_head, model.d_model) * model.init_std)
        bias = gate_bias_init(model.n_head, cfg.decay_time_min, cfg.decay_time_max)  # (H,)
        self.gate_bias = nn.Parameter(bias.expand(model.n_layer, -1).clone())  # (L, H)
        self.rope = RoPE(RopeConfig(), model, train_length) if cfg.rope else None
        if self.rope is not None:
            self.hooks = ("rotate", "content", "bias")

    def prepare(self, ctx: PositionContext) -> None:
        if self.rope is not None:
            self.rope.prepare(ctx)

    def rotate(self, q: Tensor, k: Tensor, ctx: PositionContext) -> tuple[Tensor, Tensor]:
        return (q, k) if self.rope is None else self.rope.rotate(q, k, ctx)

    def rotate_rows(self, q: Tensor, k: Tensor, ctx: PositionContext, q_start: int) -> tuple[Tensor, Tensor]:
        return (q, k) if self.rope is None else self.rope.rotate_rows(q, k, ctx, q_start)

    def content(self, layer: int, x: Tensor, ctx: PositionContext) -> Tensor:
        return log_forget_gates(x, self.gate_weight[layer], self.gate_bias[layer])

    def bias(
        self, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, ctx: PositionContext
    ) -> Tensor | None:
        return forget_bias(ctx.content[layer], q_pos, k_pos)
