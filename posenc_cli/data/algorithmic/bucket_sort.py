"""`bucket_sort` (context-sensitive): the symbols of {0, …, 4} in increasing order.

`bucket_sort: 1 0 2 0 4 =` -> ` 0 0 1 2 4`; n uniform symbols of 5, the output the sorted string, length n
(google-deepmind/randomized_positional_encodings 57bc5d0, `tasks/cs/bucket_sort.py:53-82`). The solver counts the
symbols (a bucket sort). Layout, lengths and the decoder's difference from the reference's encoder: `_chomsky`.
"""

from __future__ import annotations

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic._chomsky import REFERENCE, answer, example, read_inputs
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example

ALPHABET = 5  # the reference's vocab_size default


@register
class BucketSort(AlgorithmicTask):
    name = "bucket_sort"
    summary = "sort symbols of a 5-letter alphabet (Chomsky: context-sensitive)"
    unit = "symbols"
    train_min = 1
    reference = REFERENCE + "cs/bucket_sort.py"
    suite = "synthetic"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        symbols = rng.integers(0, ALPHABET, size=length)
        return example(cls.name, symbols.tolist(), np.sort(symbols).tolist(), length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        tokens = read_inputs(cls.name, prompt, "01234")
        return answer([s for s in "01234" for _ in range(tokens.count(s))])
