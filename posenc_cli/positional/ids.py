"""Training-time position ids other than 0..T−1: PoSE's skip-wise ids and randomized positions.

Both give each training sequence (B rows of T tokens) its own int64 ids (B, T), increasing along the row, drawn from
a `torch.Generator` (the trainer's batch sampler, so a resumed run draws the same ids). The text stays the
contiguous window the sampler drew; only the ids change. Evaluations feed a randomized-position run such draws
too (`posenc_cli.evaluation.positions`), every other run 0..T−1.

- PoSE (Zhu et al. 2023, arXiv 2309.10400, §3.2; reference dwzhu-pku/PoSE): the window of L tokens is cut into N
  chunks c_0..c_{N−1} (N = 2 in the paper) and chunk c gets the skip u_c added to its ids: u_0 = 0 and
  u_c ~ U{u_{c−1}, …, L_t − L} (L_t the target length), so the ids stay in [0, L_t) while spanning up to it. Chunk
  lengths: N − 1 distinct cut points uniform over 1..L−1 (the reference code, N = 2 only, draws the first chunk's
  length from 1..⌈L/2⌉). Text contiguous: the paper's v_i = 0 (it found the text offset of little consequence).
- Randomized positions (Ruoss et al. 2023, arXiv 2305.16843, §3): the ids of a sequence of T tokens are a sorted
  uniform random subset of [0, M), M ≥ T (M ≫ the evaluation length in the paper). The reference
  (google-deepmind/randomized_positional_encodings e8c6474) draws in every application of the encoding:
  `models/transformer.py:201-217` gives each attention layer its own RNG key for noisy RoPE (one draw shared by q
  and k, `positional_encodings.py:217-224`), and `:233-237` each layer its own noisy ALiBi. posenc
  (`train.random_positions_draw=layer`, the default) draws one subset per layer and sequence, (B, n_layer, T): each
  layer's scheme reads its own (`GPT.forward`), the embedding hook (learned, sinusoidal: the reference draws those
  once, before the layers) layer 0's. `sequence` (runs saved before the setting) draws one per sequence for every
  layer. Two differences remain: the reference draws once per batch (every row the same ids), posenc per row; and
  its noisy ALiBi draws sorted *distances* d_1 < d_2 < … from [1, M) for a Toeplitz bias −m·d_{i−j}
  (`positional_encodings.py:589-660`), where posenc's ALiBi sees differences of drawn positions, id_i − id_j.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["pose_position_ids", "random_position_ids"]


def pose_position_ids(batch: int, length: int, target: int, generator: torch.Generator, chunks: int = 2) -> Tensor:
    """(batch, length) int64 PoSE ids: `chunks` chunks of one window of `length` tokens, skipped apart so that the
    ids lie in [0, target) and increase along each row (strictly: a skip only adds). target ≥ length ≥ chunks ≥ 1.
    """
    if not 1 <= chunks <= length <= target:
        raise ValueError(f"PoSE needs 1 <= chunks <= length <= target, got {chunks}, {length}, {target}")
    rows = []
    for _ in range(batch):
        # N − 1 distinct cut points in 1..L−1: chunk c covers tokens [cut_c, cut_{c+1}) with cut_0 = 0, cut_N = L
        cuts = torch.randperm(length - 1, generator=generator)[: chunks - 1].add_(1).sort().values
        # skips u_0 = 0, u_c uniform over u_{c−1}..L_t − L (inclusive), in order
        skips = [0]
        for _ in range(chunks - 1):
            skips.append(int(torch.randint(skips[-1], target - length + 1, (1,), generator=generator)))
        chunk_of = torch.bucketize(torch.arange(length), cuts, right=True)  # (L,) chunk index of each token
        rows.append(torch.arange(length) + torch.tensor(skips)[chunk_of])
    return torch.stack(rows)  # (B, L)


def random_position_ids(
    batch: int, length: int, max_position: int, generator: torch.Generator, layers: int = 0
) -> Tensor:
    """(batch, length) int64 ids: per row a sorted uniform random subset of [0, max_position) (Ruoss et al.); with
    `layers` > 0, (batch, layers, length): one such subset per row and layer (row-major draws)."""
    if not 1 <= length <= max_position:
        raise ValueError(f"randomized positions need 1 <= length <= max_position, got {length}, {max_position}")
    n = batch * max(layers, 1)
    rows = [torch.randperm(max_position, generator=generator)[:length].sort().values for _ in range(n)]
    ids = torch.stack(rows)  # (B·layers, T)
    return ids.view(batch, layers, length) if layers else ids  # (B, layers, T) or (B, T)
