"""`duplicate_string` (context-sensitive): a bit string written twice.

`duplicate_string: 1 0 1 =` -> ` 1 0 1 1 0 1`; n uniform bits (the papers' binary alphabet), output length 2n
(google-deepmind/randomized_positional_encodings 57bc5d0, `tasks/cs/duplicate_string.py:59-82`). Layout, lengths
and the decoder's difference from the reference's encoder: `_chomsky`.
"""

from __future__ import annotations

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic._chomsky import REFERENCE, answer, example, read_inputs
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example


@register
class DuplicateString(AlgorithmicTask):
    name = "duplicate_string"
    summary = "the bit string twice (Chomsky: context-sensitive)"
    unit = "bits"
    train_min = 1
    reference = REFERENCE + "cs/duplicate_string.py"
    suite = "synthetic"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        bits = rng.integers(0, 2, size=length).tolist()
        return example(cls.name, bits, bits + bits, length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        return answer(read_inputs(cls.name, prompt, "01") * 2)
