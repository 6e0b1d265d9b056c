"""Helpers for the corpus tests: the byte tokenizer config, writing small trees of files, reading documents back,
and a training batch's windows as (x, y) (`sample_batch`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from posenc_cli.config import TokenizerConfig
from posenc_cli.data.cache import Corpus, window_index
from posenc_cli.data.tokenizer import EOD_TOKEN

BYTE = TokenizerConfig(kind="byte", vocab_size=257)


def docs_of(corpus: Corpus, split: str) -> list[str]:
    """Documents of a split, recovered by decoding and cutting at end-of-document."""
    tokens = getattr(corpus, split)
    text = corpus.tokenizer.decode(np.asarray(tokens))
    assert text == "" or text.endswith(EOD_TOKEN)
    return text.split(EOD_TOKEN)[:-1]


def write_files(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def sample_batch(
    tokens: np.ndarray,
    batch_size: int,
    seq_len: int,
    generator: torch.Generator,
    starts: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`window_index`'s windows of seq_len + 1 tokens as x = window[:-1], y = window[1:], both (B, seq_len) int64
    (the rows `packing=stream` trains on, unweighted)."""
    index = window_index(len(tokens), batch_size, seq_len, generator, starts)  # (B, T+1)
    windows = torch.from_numpy(np.asarray(tokens[index]).astype(np.int64))  # (B, T+1)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
