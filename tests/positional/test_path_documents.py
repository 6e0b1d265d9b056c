"""PaTH in packed rows: the short convolution restarts at each document's first token (`path.document_taps`)."""

from __future__ import annotations

import torch

from posenc_cli.positional.base import Documents
from posenc_cli.positional.path import document_taps, short_conv


def test_the_convolution_of_a_packed_row_is_each_documents_own() -> None:
    g = torch.Generator().manual_seed(0)
    K, lengths = 3, (4, 1, 5)
    T = sum(lengths)
    raw = torch.randn(2, 3, T, 4, generator=g)  # (B, H, T, d)
    weight = torch.randn(3, 4, K, generator=g)  # (H, d, K)
    docs = Documents.from_ids(torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)]).expand(2, T))
    lo, end = 2, T  # the outputs of tokens [2, T), as a chunk whose keys start at 2
    frame = raw[:, :, lo - K + 1 : end]  # (B, H, K − 1 + n, d): the K − 1 tokens before the first output too
    out = short_conv(frame, weight, document_taps(docs.segment, lo, end, K))  # (B, H, n, d)
    start = 0
    alone = []
    for n in lengths:
        x = torch.nn.functional.pad(raw[:, :, start : start + n], (0, 0, K - 1, 0))  # zeros before its first token
        alone.append(short_conv(x, weight))
        start += n
    torch.testing.assert_close(out, torch.cat(alone, dim=2)[:, :, lo:], rtol=0, atol=1e-6)
    assert not torch.allclose(short_conv(frame, weight), out)  # without the taps the documents mix
