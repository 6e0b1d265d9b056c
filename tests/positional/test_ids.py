"""Training-time position ids (posenc_cli/positional/ids.py): PoSE's skip-wise ids, randomized positions."""

from __future__ import annotations

import pytest
import torch

from posenc_cli.positional.ids import pose_position_ids, random_position_ids


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(("length", "target", "chunks"), [(16, 64, 2), (128, 512, 2), (32, 32, 2), (20, 100, 4)])
def test_pose_ids_span_the_target_inside_windows_of_the_original_length(length: int, target: int, chunks: int) -> None:
    ids = pose_position_ids(64, length, target, gen(), chunks)
    assert ids.shape == (64, length) and ids.dtype == torch.int64  # windows of L tokens
    assert int(ids.min()) >= 0 and int(ids.max()) < target  # within [0, s·L)
    assert bool((ids[:, 1:] > ids[:, :-1]).all())  # increasing within each chunk (and across them)
    assert bool((ids[:, 0] == 0).all())  # u_0 = 0
    jumps = (ids.diff(dim=1) > 1).sum(dim=1)
    assert int(jumps.max()) <= chunks - 1  # a skip only between chunks: each chunk is consecutive ids
    if target > length:
        assert int(ids.max()) > length - 1  # the ids reach beyond L ...
        assert int(ids.max()) >= target - 1 - target // 8  # ... up to about s·L over a batch


def test_pose_ids_are_deterministic_for_a_seed() -> None:
    a, b = pose_position_ids(8, 16, 64, gen(3)), pose_position_ids(8, 16, 64, gen(3))
    assert torch.equal(a, b)
    assert not torch.equal(a, pose_position_ids(8, 16, 64, gen(4)))


def test_pose_skips_are_uniform_over_their_range() -> None:
    """Two chunks: the second chunk's skip u_1 ~ U{0, ..., s·L − L} (the paper's u_i ~ U{u_{i−1}, ..., L_t − L_c})."""
    L, target = 8, 40
    ids = pose_position_ids(4000, L, target, gen(1))
    skips = (ids[:, -1] - (L - 1)).float()  # the last token lies in the last chunk
    assert int(skips.min()) == 0 and int(skips.max()) == target - L
    assert abs(float(skips.mean()) - (target - L) / 2) < 1.0


def test_pose_with_one_chunk_is_arange_and_bad_sizes_are_refused() -> None:
    assert torch.equal(pose_position_ids(2, 8, 32, gen(), chunks=1), torch.arange(8).expand(2, 8))
    with pytest.raises(ValueError):
        pose_position_ids(1, 16, 8, gen())  # target < L
    with pytest.raises(ValueError):
        pose_position_ids(1, 4, 8, gen(), chunks=5)


def test_random_positions_are_sorted_distinct_subsets() -> None:
    ids = random_position_ids(32, 16, 256, gen())
    assert ids.shape == (32, 16) and ids.dtype == torch.int64
    assert bool((ids[:, 1:] > ids[:, :-1]).all())  # sorted, distinct
    assert int(ids.min()) >= 0 and int(ids.max()) < 256
    assert int(ids.max()) > 200  # they spread over [0, M)
    assert torch.equal(ids, random_position_ids(32, 16, 256, gen()))
    assert torch.equal(random_position_ids(2, 8, 8, gen()), torch.arange(8).expand(2, 8))  # M = T: 0..T−1
    with pytest.raises(ValueError):
        random_position_ids(1, 9, 8, gen())
