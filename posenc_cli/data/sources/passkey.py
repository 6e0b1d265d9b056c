"""`data=passkey`: seeded synthetic passkey-retrieval episodes (Mohtashami & Jaggi 2023), one document each.

An episode is filler text repeated to a target length with one key sentence hidden at a depth, then a question:

    <filler[:b]> The pass key is 12345. Remember it. 12345 is the pass key.<filler[b:n]> What is the pass key?
    The pass key is 12345

Depth = b / n, the fraction of the filler before the key sentence (0: the key opens the episode, 1: it sits right
before the question). Every piece starts with a space and ends without one, so byte-level BPE cuts the joined text
at the same places as the pieces one by one (its pre-tokenizer splits before " word" / " 123"). The landmark/YaRN
preamble sentence is left out: at a training length of 128 bytes it would not fit.

Episode lengths (in characters, = byte tokens) are uniform in [data.passkey_min_len, data.passkey_max_len], depths
uniform in [0, 1]; they are tokenized by the ordinary token cache, so `train()` runs unchanged. Short episodes
(about the training length) teach retrieval; the `passkey` evaluation task (`posenc eval-passkey`, built from the
same pieces in token space) tests whether it survives beyond the training length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from posenc_cli.config import DataConfig, non_negative, positive
from posenc_cli.data.sources import register
from posenc_cli.data.sources.base import (
    FORMAT_VERSION,
    DataSource,
    Docs,
    ProgressFn,
    Source,
    memory_table,
    prompt_answer,
    short_hash,
    whole,
)
from posenc_cli.errors import ConfigError

FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY_SENTENCE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
GENERATOR_VERSION = 1  # bump when the episode text or the sampling changes (part of the corpus fingerprint)
DEFAULT_DIGITS = 5


@dataclass(kw_only=True)
class PasskeyDataConfig(DataConfig):
    """`data=passkey`: the number of episodes (both splits; `val_fraction` of them go to validation), their length
    range in characters (= byte tokens; raised to the shortest possible episode), the digits of each key, and the
    generator's seed."""

    source: str = "passkey"
    passkey_episodes: int = 8000
    passkey_min_len: int = 0
    passkey_max_len: int = 128
    passkey_digits: int = DEFAULT_DIGITS
    passkey_seed: int = 0

    def validate(self) -> None:
        super().validate()
        positive(self, "data", "passkey_episodes", "passkey_digits")
        non_negative(self, "data", "passkey_min_len", "passkey_seed")
        if self.passkey_max_len < self.passkey_min_len:
            raise ConfigError(
                f"data.passkey_max_len={self.passkey_max_len} is below data.passkey_min_len={self.passkey_min_len}"
            )
        if self.passkey_digits > 18:
            raise ConfigError(f"data.passkey_digits must be <= 18, got {self.passkey_digits}")


def random_keys(rng: np.random.Generator, n: int, digits: int) -> list[str]:
    """`n` uniform keys of exactly `digits` digits (no leading zero)."""
    low = 10 ** (digits - 1) if digits > 1 else 0
    return [str(k) for k in rng.integers(low, 10**digits, size=n)]


def filler_before(n_filler: int, depth: float) -> int:
    """Filler units placed before the key sentence: round(depth · n_filler)."""
    return round(depth * n_filler)


def episode_text(key: str, n_filler: int, depth: float) -> tuple[str, str]:
    """(prompt, answer) with `n_filler` characters of filler, the key sentence after `depth` of them."""
    filler = (FILLER * math.ceil(n_filler / len(FILLER)))[:n_filler]
    b = filler_before(n_filler, depth)
    return filler[:b] + KEY_SENTENCE.format(key=key) + filler[b:] + QUESTION, " " + key


def fixed_chars(digits: int) -> int:
    """Characters of an episode without filler (key sentence, question, answer)."""
    prompt, answer = episode_text("0" * digits, 0, 0.0)
    return len(prompt) + len(answer)


def make_episodes(n: int, *, min_len: int, max_len: int, digits: int, seed: int) -> list[str]:
    """`n` episodes (prompt + answer, the answer scored: `prompt_answer`), lengths uniform in [min_len, max_len]
    characters (raised to the shortest possible episode), depths uniform in [0, 1], keys uniform; the same arguments
    give the same list."""
    rng = np.random.default_rng([seed, GENERATOR_VERSION])
    fixed = fixed_chars(digits)
    lengths = rng.integers(max(min_len, fixed), max(max_len, fixed) + 1, size=n)  # (n,)
    depths = rng.random(n)  # (n,)
    keys = random_keys(rng, n, digits)
    texts = []
    for key, length, depth in zip(keys, lengths.tolist(), depths.tolist(), strict=True):  # one step per episode
        prompt, answer = episode_text(key, length - fixed, depth)
        texts.append(prompt_answer(prompt, answer))  # the text is prompt + answer; the answer is scored
    return texts


def corpus_documents(data: PasskeyDataConfig) -> tuple[list[str], list[str]]:
    """(train, val) episodes of `data=passkey`: the first round(val_fraction · N) episodes (at least one when
    val_fraction > 0) are the validation split."""
    docs = make_episodes(
        data.passkey_episodes,
        min_len=data.passkey_min_len,
        max_len=data.passkey_max_len,
        digits=data.passkey_digits,
        seed=data.passkey_seed,
    )
    n_val = max(1, round(data.val_fraction * len(docs))) if data.val_fraction > 0 else 0
    n_val = min(n_val, len(docs) - 1)
    return docs[n_val:], docs[:n_val]


def corpus_info(data: PasskeyDataConfig) -> dict[str, Any]:
    """JSON-safe summary of a passkey corpus; also what its cache fingerprint is made of."""
    return {
        "source": "passkey",
        "generator_version": GENERATOR_VERSION,
        "episodes": data.passkey_episodes,
        "min_len": max(data.passkey_min_len, fixed_chars(data.passkey_digits)),
        "max_len": max(data.passkey_max_len, fixed_chars(data.passkey_digits)),
        "digits": data.passkey_digits,
        "seed": data.passkey_seed,
        "val_fraction": data.val_fraction,
    }


@register
class PasskeySource(DataSource):
    name = "passkey"
    config_cls = PasskeyDataConfig
    tasks = ("passkey", "extrapolate")  # a sweep job trained on episodes measures retrieval, then perplexity

    @classmethod
    def open(cls, data: PasskeyDataConfig, root: Path, progress: ProgressFn | None) -> Source:
        info = corpus_info(data)

        def documents() -> tuple[Docs, Docs, str]:
            train, val = corpus_documents(data)
            return whole(memory_table(train)), whole(memory_table(val)), "generated episodes (seeded)"

        return Source(fingerprint=short_hash("passkey", FORMAT_VERSION, info), info=info, documents=documents)
