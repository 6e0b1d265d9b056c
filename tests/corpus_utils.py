"""Helpers for the corpus tests: the byte tokenizer config, writing small trees of files, reading documents back."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from posenc_cli.config import TokenizerConfig
from posenc_cli.data.cache import Corpus
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
