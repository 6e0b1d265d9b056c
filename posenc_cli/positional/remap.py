"""Inference-time position remapping of a RoPE model: Self-Extend and ReRoPE (`pos.remap`, `posenc extend --method`).

Both keep the normal RoPE score for pairs closer than a window W and use a second, remapped score beyond it,
merged before the softmax by a mask on the distance i − j (i, j the position ids of query and key):

- Self-Extend (Jin et al. 2024, arXiv 2401.01325, "LLM Maybe LongLM", §3): neighbour window W, group size G. Beyond
  the window, keys sit at ⌊j/G⌋ and queries at ⌊i/G⌋ + W − ⌊W/G⌋, so the grouped distance continues from about W
  at the window's edge; the largest distance seen at length T is about W + (T − W)/G. When G does not divide W,
  posenc follows datamllab/LongLM's corrected formula (commit 715c1e3; `self_extend_patch/Llama_4_40.py:131` at
  cdbbb06): the query shift is W − ⌊W/G⌋ with floor division, as in `remapped_positions` and
  `remapped_distance`. Several other patches of that repository still divide exactly (W − W/G, e.g. `Llama.py:134`,
  `Gemma.py:144`), which gives fractional positions when G ∤ W; posenc does not follow those. LongLM's log-n
  query scaling is an option, off by default (`SelfExtend.apply(scale_base=-1)`; `extend --method self-extend
  --logn` turns it on with scale_base = the training length).
- ReRoPE (Su 2023, "Rectified Rotary Position Embeddings", bojone/rerope): relative distance min(i − j, W), i.e.
  queries at W and keys at 0 beyond the window; the leaky variant (k > 1) uses W + (i − j − W)/k, queries at
  i/k + W − W/k and keys at j/k.
  The reference also multiplies every query, before both rotations, by max(1, log(i + 1) / log L)
  (`rerope_patch.py:56`, `leaky_rerope_patch.py:61`): that is the model's `attn_scale=logn`
  (`posenc_cli.attention`), which `extend` turns on for ReRoPE by default, not part of the remapping here.

RoPE encodes absolute angles, so the remapped score needs q and k rotated a second time (`remapped_positions`); the
attention then computes both score matrices chunk by chunk (`posenc_cli.attention.attend_remapped`). Pairs with
i − j < W always take the normal score, so a sequence whose ids span fewer than W positions is plain RoPE. The
settings (`RemapConfig`: method, window, group, leaky) are `config`'s, which imports no torch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc_cli.config import RemapConfig


def remapped_positions(cfg: RemapConfig, ids: Tensor) -> tuple[Tensor, Tensor]:
    """Position ids (..., T) int -> (query positions, key positions) of the remapped score, float32 (..., T) each.

    Self-Extend: ⌊i/G⌋ + W − ⌊W/G⌋ and ⌊j/G⌋; ReRoPE: W and 0; Leaky ReRoPE: i/k + W − W/k and j/k. The remapped
    distance (query position − key position) is what `remapped_distance` gives.
    """
    if cfg.method == "self-extend":
        g, w = cfg.group, cfg.window
        grouped = torch.div(ids, g, rounding_mode="floor")
        return (grouped + (w - w // g)).to(torch.float32), grouped.to(torch.float32)
    if cfg.method == "rerope":
        if cfg.leaky:
            k = float(cfg.leaky)
            scaled = ids.to(torch.float64) / k
            return (scaled + cfg.window * (1.0 - 1.0 / k)).to(torch.float32), scaled.to(torch.float32)
        zeros = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
        return zeros + cfg.window, zeros
    raise ValueError(f"no remapping for method '{cfg.method}'")


def remapped_distance(cfg: RemapConfig, i: int, j: int) -> float:
    """The paper's relative position of query i and key j (j ≤ i), written out per pair (tests, documentation)."""
    w = cfg.window
    if i - j < w:
        return float(i - j)
    if cfg.method == "self-extend":
        g = cfg.group
        return float(i // g + w - w // g - j // g)
    if cfg.leaky:
        return w + (i - j - w) / cfg.leaky
    return float(w)
