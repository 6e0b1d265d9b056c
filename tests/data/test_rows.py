"""The rows of a batch by train.packing (`data/rows.py`): windows, one example per row, examples packed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from corpus_utils import sample_batch

from posenc_cli.data.rows import (
    check_examples_fit,
    draw_examples,
    example_rows,
    find_examples,
    packed_rows,
    stream_rows,
)
from posenc_cli.data.sources.base import prompt_answer
from posenc_cli.data.tokenizer import ByteTokenizer
from posenc_cli.errors import ConfigError

BYTE = ByteTokenizer()
EOD = BYTE.eod_id
DOCS = [prompt_answer("ab", " c"), prompt_answer("defg", " hi"), "plain", prompt_answer("j", " k")]


def _split() -> tuple[np.ndarray, np.ndarray]:
    ids, scored = BYTE.encode_scored(DOCS)
    return ids.astype(np.int64), scored


def test_examples_are_the_documents_and_refused_when_too_long() -> None:
    ids, _ = _split()
    ex = find_examples(ids, EOD)
    assert ex.lengths.tolist() == [len(d) + 1 for d in DOCS]  # [eod] + document as inputs
    check_examples_fit(ex, 8, "none", "training")
    with pytest.raises(ConfigError, match=r"longest training example is 9 tokens .* set train.seq_len=8 or more"):
        check_examples_fit(ex, 7, "none", "training")


def test_one_example_per_row_from_position_0_pads_unscored() -> None:
    ids, scored = _split()
    ex = find_examples(ids, EOD)
    rows = example_rows(ids, scored, ex, np.array([1, 0, 2]), 10, EOD, answer_only=True)
    x, y = rows.tokens[:, :-1], rows.tokens[:, 1:]
    assert x[0, : ex.lengths[1]].tolist() == [EOD, *b"defg hi"]  # opened by end-of-document at position 0
    assert y[0, : ex.lengths[1]].tolist() == [*b"defg hi", EOD]
    assert rows.weights is not None and rows.position_ids is None and rows.documents is None
    assert rows.weights[0].tolist() == [False] * 4 + [True] * 4 + [False] * 2  # " hi" and its end; no pad
    assert rows.weights[2].tolist() == [True] * 6 + [False] * 4  # plain text: every real target
    assert rows.real == sum(int(ex.lengths[i]) for i in (1, 0, 2)) and rows.scored == 4 + 3 + 6
    every = example_rows(ids, scored, ex, np.array([1]), 10, EOD, answer_only=False)
    assert every.weights is not None and every.weights[0].tolist() == [True] * 8 + [False] * 2


def test_packed_rows_are_the_examples_side_by_side() -> None:
    """Every packed example equals its `none` row: same inputs, targets and weights at positions restarting at 0,
    with its own document id; pads (a suffix) carry -1 and no weight."""
    ids, scored = _split()
    ex = find_examples(ids, EOD)
    rows = packed_rows(ids, scored, ex, 4, 12, torch.Generator().manual_seed(3), EOD, answer_only=True)
    assert rows.position_ids is not None and rows.documents is not None and rows.weights is not None
    spans = [ids[s : e + 1].tolist() for s, e in zip(ex.starts, ex.ends, strict=True)]  # each example's targets
    seen = 0
    for r in range(4):
        docs = rows.documents[r]
        real = (docs >= 0).tolist()
        assert real == sorted(real, reverse=True) and docs[0] == 0  # pads only at the end
        for d in range(int(docs.max()) + 1):
            cols = (docs == d).nonzero().flatten()  # contiguous, in document order
            assert cols.tolist() == list(range(int(cols[0]), int(cols[0]) + cols.numel()))
            assert rows.position_ids[r, cols].tolist() == list(range(cols.numel()))
            pick = spans.index(rows.tokens[r, cols + 1].tolist())
            alone = example_rows(ids, scored, ex, np.array([pick]), 12, EOD, answer_only=True)
            n = cols.numel()
            assert torch.equal(rows.tokens[r, cols], alone.tokens[0, :n])  # inputs: [eod] + the document
            assert torch.equal(rows.weights[r, cols], alone.weights[0, :n])  # type: ignore[index]
            seen += n
        assert not rows.weights[r, docs < 0].any()
    assert rows.real == seen and int(rows.documents.max()) >= 1  # some row holds two examples


def test_draws_follow_the_generator() -> None:
    ids, scored = _split()
    ex = find_examples(ids, EOD)
    a = packed_rows(ids, scored, ex, 3, 12, torch.Generator().manual_seed(5), EOD, answer_only=False)
    b = packed_rows(ids, scored, ex, 3, 12, torch.Generator().manual_seed(5), EOD, answer_only=False)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.documents, b.documents)  # type: ignore[arg-type]
    picks = draw_examples(ex, 5, torch.Generator().manual_seed(1))
    assert picks.tolist() == torch.randint(0, 4, (5,), generator=torch.Generator().manual_seed(1)).tolist()


def test_stream_rows_are_sample_batch_windows_weighted_by_the_mask() -> None:
    ids, scored = _split()
    tokens = np.tile(ids, 20)
    mask = np.tile(scored, 20)
    rows = stream_rows(tokens, mask, 6, 9, torch.Generator().manual_seed(2), None, answer_only=True)
    x, y = sample_batch(tokens, 6, 9, torch.Generator().manual_seed(2))
    assert torch.equal(rows.tokens[:, :-1], x) and torch.equal(rows.tokens[:, 1:], y)
    assert rows.weights is not None and rows.real == 6 * 9
    for b in range(6):  # the weight of a target is the mask at that target's offset
        start = int(np.flatnonzero([np.array_equal(tokens[s : s + 10], rows.tokens[b].numpy()) for s in range(200)])[0])
        assert rows.weights[b].tolist() == mask[start + 1 : start + 10].astype(bool).tolist()
    plain = stream_rows(tokens, mask, 6, 9, torch.Generator().manual_seed(2), None, answer_only=False)
    assert plain.weights is None and plain.scored == 6 * 9
