"""`binary_addition` (context-sensitive): the sum of two little-endian binary numbers.

`binary_addition: 0 0 1 + 0 1 1 0 1 =` -> ` 0 1 0 1 1 2` (4 + 22 = 26): for n >= 3 the first number's length is
uniform in 1..n−2, the second's n − 1 minus it, each number uniform in 1..2^len − 1 written with len bits
(little-endian, so a short number ends in zeros); the output the sum little-endian without high zeros and the
termination token 2 (the reference pads with zeros to n + 1 and masks them; here the answer stops). For n <= 2 the
input is one number in 0..2^n − 2 of n bits and no `+`, the output that number (a reference quirk, kept)
(google-deepmind/randomized_positional_encodings 57bc5d0, `tasks/cs/binary_addition.py:95-196`; the reference writes
`+` as its token 2). Layout, lengths and the decoder's difference from the reference's encoder: `_chomsky`.
"""

from __future__ import annotations

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic._chomsky import REFERENCE, answer, example, read_inputs
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example

TERMINATION = 2


def little_endian(number: int, width: int = 0) -> list[int]:
    """The bits of `number`, lowest first, at least `width` of them (0 is [0])."""
    return [int(b) for b in reversed(f"{number:b}".zfill(width))]


def uniform_below(rng: np.random.Generator, bits: int) -> int:
    """A number uniform in 1..2^bits − 1 at any size (numpy integers stop at 64 bits): uniform bits, redrawn at 0."""
    while True:
        number = int("".join(map(str, rng.integers(0, 2, size=bits).tolist())), 2)
        if number:
            return number


@register
class BinaryAddition(AlgorithmicTask):
    name = "binary_addition"
    summary = "the sum of two little-endian binary numbers (Chomsky: context-sensitive)"
    unit = "tokens"
    train_min = 1
    reference = REFERENCE + "cs/binary_addition.py"
    suite = "synthetic"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        if length <= 2:
            number = int(rng.integers(0, 2**length - 1))
            return example(cls.name, little_endian(number, length), [*little_endian(number), TERMINATION], length)
        first = int(rng.integers(1, length - 1))
        a, b = uniform_below(rng, first), uniform_below(rng, length - 1 - first)
        inputs = [*little_endian(a, first), "+", *little_endian(b, length - 1 - first)]
        return example(cls.name, inputs, [*little_endian(a + b), TERMINATION], length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        """Add the two bit lists column by column with a carry (independent of Python's integers)."""
        numbers = " ".join(read_inputs(cls.name, prompt, "01+")).split(" + ")
        if len(numbers) > 2 or any(not n for n in numbers):
            raise ValueError(f"not a {cls.name} prompt: {prompt!r}")
        columns = [[int(b) for b in n.split()] for n in numbers]
        width = max(len(c) for c in columns)
        out, carry = [], 0
        for i in range(width):  # one column per bit, lowest first
            carry += sum(c[i] for c in columns if i < len(c))
            out.append(carry % 2)
            carry //= 2
        out += [1] if carry else []
        while len(out) > 1 and out[-1] == 0:  # no high zeros
            out.pop()
        return answer([*out, TERMINATION])
