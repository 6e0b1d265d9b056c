"""`frequent-words` (RULER FWE, `scripts/synthetic.yaml` fwe; NVIDIA/RULER c3f5e3b
`scripts/data/synthetic/freq_words_extraction.py`): coded text whose words follow a Zipf law; return the three most
frequent coded words.

As in RULER: a vocabulary of (length − generation budget) // 50 coded words (line 113-114) of 6 random lower-case
letters (`coded_wordlen`, line 61; distinct, line 76-79), the top-ranked one replaced by "..." as noise (line 81);
with N words of text, the word of rank k appears floor(N · k^−α / ζ(α)) times, α = 2 (line 63, 86-88), shuffled
(line 90); the answer is ranks 2-4 in rank order (line 91); N is the largest that fits (line 100-106). RULER's budget
is 50 tokens (`constants.py` 'freq_words_extraction'), its score `string_match_all` (`eval/synthetic/constants.py:44`).
Deviations: below rank 4 a count equal to rank 4's is lowered by one, so the answer is unique (RULER leaves such a tie
to chance); the instruction is shortened to fit a tiny window; the text has no depth (cells record depth None). A
length whose vocabulary has fewer than 4 words (the noise and three answers) is n/a, as is one too short for
N ≥ 27, the least that gives rank 4 a word.
"""

from __future__ import annotations

import math

import numpy as np

from posenc_cli.data.ruler import register
from posenc_cli.data.ruler.base import (
    RULER_SIZES,
    ContextTask,
    Draft,
    Episode,
    PromptTooShort,
    Sizes,
    context_episode,
)

ALPHA = 2.0  # freq_words_extraction.py:63
ZETA = math.pi**2 / 6  # ζ(2), RULER's scipy.special.zeta(alpha)
TOKENS_PER_WORD = 50  # vocabulary = prompt tokens // 50 (freq_words_extraction.py:114)
NOISE = "..."
LETTERS = "abcdefghijklmnopqrstuvwxyz"
QUESTION = " Ignore the dots. What are the three most frequent coded words? The three most frequent coded words are"


def zipf_counts(n_words: int, vocab: int, alpha: float = ALPHA) -> list[int]:
    """Occurrences of the words of rank 1..`vocab` in `n_words` words of text: floor(N · k^−α / ζ(α)) (RULER
    `freq_words_extraction.py:87`, ζ(2) = π²/6), every rank past 4 held below rank 4 so that ranks 2-4 are the
    three most frequent words other than the noise."""
    assert alpha == ALPHA, "ζ is π²/6 for α = 2 only"
    counts = [math.floor(n_words * k**-alpha / ZETA) for k in range(1, vocab + 1)]
    return counts[:4] + [min(c, counts[3] - 1) for c in counts[4:]]


def smallest_text() -> int:
    """The least N that gives the fourth rank one word (27 for α = 2)."""
    return math.ceil(4**ALPHA * ZETA)


@register
class FrequentWords(ContextTask):
    name = "frequent-words"
    summary = "Zipf-distributed coded text (α = 2, vocabulary length/50); return the three most frequent words"
    size_names = ("coded_letters",)
    tokens_to_generate = 50  # RULER scripts/data/synthetic/constants.py 'freq_words_extraction'
    has_depth = False

    @classmethod
    def draft(
        cls, rng: np.random.Generator, depth: float, sizes: Sizes = RULER_SIZES, room: int | None = None
    ) -> Draft:
        vocab_size = 4 if room is None else room // TOKENS_PER_WORD  # training text: the least vocabulary
        if vocab_size < 4:
            raise PromptTooShort(
                f"{room} prompt tokens give a vocabulary of {vocab_size} coded words (RULER: tokens // "
                f"{TOKENS_PER_WORD}), fewer than the noise and three answers"
            )
        vocab: list[str] = []
        while len(vocab) < vocab_size:  # a handful of redraws at most
            word = "".join(LETTERS[i] for i in rng.integers(0, len(LETTERS), size=sizes.coded_letters))
            if word not in vocab:
                vocab.append(word)
        vocab[0] = NOISE
        shuffle_seed = int(rng.integers(0, 1 << 63))

        def make(n: int) -> Episode:
            words = [w for w, c in zip(vocab, zipf_counts(n, vocab_size), strict=True) for _ in range(c)]
            order = np.random.default_rng(shuffle_seed).permutation(len(words))
            context = " Coded text:" + "".join(" " + words[k] for k in order)
            return context_episode(context, QUESTION, vocab[1:4])

        def what(n: int) -> str:
            return f"{n} coded words of a {vocab_size}-word vocabulary"

        return Draft(make, smallest_text(), what)
