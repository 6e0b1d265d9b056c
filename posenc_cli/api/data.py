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
    documents, bytes and tokens per split, fingerprints, cache path, seconds, whether the cache was reused), with
    the training split's `longest_example` (tokens: [eod] + the document, what one row must hold under
    `train.packing=none`) and `longest_prompt` (the tokens read before an example's first scored token, [eod]
    included; None when every token is scored): a task cell whose prompt is longer asks for a length no example held.
    A mixture of tasks adds `longest_prompt_by_task` ({task: tokens}), the bound of each task's cells.
    `progress(stage, done, total)` follows the reading and tokenizing."""
    # deferred: torch
    from posenc_cli.data.cache import load_corpus
    from posenc_cli.data.examples import find_examples, longest_spans

    cfg = train_config(overrides, config_dir=config_dir)
    corpus = load_corpus(cfg.data, cfg.tokenizer, progress=progress)
    longest, prompt = longest_spans(find_examples(corpus.train, corpus.tokenizer.eod_id), corpus.train_scored)
    return {**corpus.info, "longest_example": longest, "longest_prompt": prompt}
