"""`even_pairs` (regular): whether a bit string has an odd number of unequal neighbours (`01` and `10` pairs).

`even_pairs: 0 0 1 1 1 0 =` -> ` 0`; n uniform bits, the output the count of unequal neighbours mod 2
(google-deepmind/randomized_positional_encodings 57bc5d0, `tasks/regular/even_pairs.py:43-59`). The solver uses the
closed form: the count is odd exactly when the first and the last bit differ. Layout, lengths and the decoder's
difference from the reference's encoder: `_chomsky`.
"""

from __future__ import annotations

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic._chomsky import REFERENCE, answer, example, read_inputs
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example


@register
class EvenPairs(AlgorithmicTask):
    name = "even_pairs"
    summary = "the parity of the number of unequal neighbouring bits (Chomsky: regular)"
    unit = "bits"
    train_min = 1  # the reference trains lengths 1..40
    reference = REFERENCE + "regular/even_pairs.py"
    suite = "synthetic"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        bits = rng.integers(0, 2, size=length)
        return example(cls.name, bits.tolist(), [int(np.sum(bits[:-1] != bits[1:]) % 2)], length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        bits = read_inputs(cls.name, prompt, "01")
        return answer([int(bits[0] != bits[-1])])
