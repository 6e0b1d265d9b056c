"""`posenc data` as a function: prepare the token cache of a composed config's corpus and return its summary."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posenc_cli.api.training import train_config

__all__ = ["prepare_data"]


def prepare_data(
    overrides: Sequence[str] = (),
    *,
    config_dir: str | Path | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Tokenize (or reuse) the corpus of the config composed from `overrides` (`data=text data.paths=[notes/]
    tokenizer=bpe`) into the token cache, as `posenc data` does, and return its summary (`Corpus.info`: source,
    documents, bytes and tokens per split, fingerprints, cache path, seconds, whether the cache was reused).
    `progress(stage, done, total)` follows the reading and tokenizing."""
    # deferred: torch
    from posenc_cli.data.cache import load_corpus

    cfg = train_config(overrides, config_dir=config_dir)
    return load_corpus(cfg.data, cfg.tokenizer, progress=progress).info
