"""NoPE HeadScale (Wang et al., ACL 2024 Findings, arXiv 2404.12224): a learnable softmax temperature λ_h per layer
and head, multiplying q (so every logit of head h) at every position, fitted with the rest of the model frozen on
sequences of the longer length (`posenc calibrate RUN --temperature head-scale`).

Reference: `AntNLP/nope_head_scale` `models/llama_nope.py:108-110` (one parameter per head of each attention
module, initialised to `softmax_scale`), `:129-136` (q × λ_h/√d, no position dependence) and `:64-71` (the base
model frozen, only the scales trained); `scripts/run_hs.sh:33-49` trains 200 steps at 8192 tokens (4× the 2048 of
pre-training) from λ = 1.6 with lr 0.1 or 0.05, `configs/tnl_hs.yaml` sets warm-up ratio 0.1 and no weight decay.
posenc initialises λ_h = 1, the trained model unchanged; `calibrate` takes the reference's initial value as an option.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posenc_cli.config import ModelConfig
from posenc_cli.temperatures import register
from posenc_cli.temperatures.base import Temperature


@register
@dataclass(frozen=True)
class HeadScale(Temperature):
    """No settings: λ_h is the layer's parameter `head_scale` (H,)."""

    name = "head-scale"
    paper = "NoPE HeadScale (Wang et al. 2024, arXiv 2404.12224)"
    parameter = "head_scale"

    @classmethod
    def from_model(cls, cfg: ModelConfig) -> HeadScale:
        return cls()

    def init_parameter(self, n_head: int) -> Tensor:
        return torch.ones(n_head)

    def query_factor(self, rows: Tensor | None, param: Tensor | None) -> Tensor:
        assert param is not None
        return param.float()[:, None, None]  # (H, 1, 1): every query row of head h

    def describe(self) -> str:
        return "HeadScale: λ_h per head"
