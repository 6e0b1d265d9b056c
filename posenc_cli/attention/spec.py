"""The facts the kernel choice reads (`KernelSpec`), apart from the rules (`choose`) and the roads (`kernels`), so
the forward's state can key its chosen kernels by them without importing the choice."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posenc_cli.positional.span import FULL, Span


@dataclass(frozen=True)
class KernelSpec:
    """Every fact the kernel choice reads, for one layer of one forward.

    has_bias, bias_shared, offers_key_bias, offers_score_mod, owns_scores: the scheme's `has_bias`,
    `bias_shared_across_layers`, `offers_key_bias`, `offers_score_mod`, `owns_scores`. flex_compiles: Inductor can
    build FlexAttention's kernel on the device (`flex.can_compile`; read only for a scheme that offers a score_mod).
    remap: the scheme remaps positions and some pair of this forward's ids is at least its window apart.
    dtype, device, needs_grad: q's dtype, device type and `requires_grad`. batch, n_head, seq_len: q's (B, H, T).
    causal; q_start: first query row computed (> 0: KV-cache decoding); chunk_size: queries per chunk forced on the
    bias road (None: from `BIAS_CHUNK_BYTES`, or the key-bias road where it applies); dropout_p.
    span: the layer's attention span where it hides keys at this length (`describe` records `FULL` otherwise).
    documents: packed rows (`PositionContext.documents`): a query sees only its own document's keys.
    sinks: the layer appends a trained logit per head to every softmax row (`model.attn_sinks`,
    `options.attn_sinks`): only the roads that compute the weights themselves can.
    """

    has_bias: bool
    dtype: torch.dtype
    device: str
    seq_len: int
    batch: int = 1
    n_head: int = 1
    needs_grad: bool = False
    bias_shared: bool = False
    offers_key_bias: bool = False
    offers_score_mod: bool = False
    owns_scores: bool = False
    flex_compiles: bool = False
    remap: bool = False
    causal: bool = True
    q_start: int = 0
    chunk_size: int | None = None
    dropout_p: float = 0.0
    span: Span = FULL
    documents: bool = False
    sinks: bool = False
