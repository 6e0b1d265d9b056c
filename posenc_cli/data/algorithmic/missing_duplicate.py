"""`missing_duplicate` (context-sensitive): the bit hidden in a string written twice.

`missing_duplicate: 0 1 1 0 0 2 1 0 =` -> ` 1`: s of n // 2 uniform bits written twice, the symbol at one uniform
position of the 2·(n // 2) replaced by 2, and 3 appended when n is odd; the output the hidden bit; n = 1 is the
reference's fixed `1` -> 1 (google-deepmind/randomized_positional_encodings 57bc5d0,
`tasks/cs/missing_duplicate_string.py:45-89`). Layout, lengths and the decoder's difference from the reference's
encoder: `_chomsky`.
"""

from __future__ import annotations

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic._chomsky import REFERENCE, answer, example, read_inputs
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example

HIDDEN, PAD = 2, 3


@register
class MissingDuplicate(AlgorithmicTask):
    name = "missing_duplicate"
    summary = "the bit hidden in a string written twice (Chomsky: context-sensitive)"
    unit = "tokens"
    train_min = 1
    reference = REFERENCE + "cs/missing_duplicate_string.py"
    suite = "synthetic"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        if length == 1:
            return example(cls.name, [1], [1], length)
        half = rng.integers(0, 2, size=length // 2).tolist()
        doubled = half + half
        at = int(rng.integers(0, len(doubled)))
        hidden, doubled[at] = doubled[at], HIDDEN
        return example(cls.name, doubled + [PAD] * (length % 2), [hidden], length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        tokens = read_inputs(cls.name, prompt, "0123")
        if tokens == ["1"]:
            return answer([1])
        body = tokens[:-1] if tokens[-1] == "3" else tokens
        half = len(body) // 2
        at = body.index("2")
        return answer([body[at + half if at < half else at - half]])
