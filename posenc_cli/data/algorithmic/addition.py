"""`addition` (the reference's `s2s_addition`): the sum of two numbers written digit by digit.

`Compute 4 0 7 + 9 5 ?` -> ` The answer is 5 0 2.`; length = the digits of the longer operand. The reference's
builder bins examples by the pair of operand lengths (`a-by-b`), every bin holding the same number of examples:
training on the pairs in [train_min, L]², testing on the pairs in [train_min, 2L]² with at least one operand in
L+1..2L (McGill-NLP/length-generalization 40f8a44, `scripts/dataset_builders/make_addition_dataset.py:35-62,86-133`;
`--train_min` 4). Here a split whose operand lengths start at `least` has 2(n − least) + 1 bins of length n
((n, j) and (j, n) for least <= j <= n, (n, n) once): `sample_in` draws one of them uniformly, and `length_weight`
is that count, so a length drawn in proportion to it (training: `data.sources.algorithmic`) or weighed by it (the
means of `eval-algorithmic`) gives every bin the same share, as the builder does. With least = 1 the weight is
2n − 1. Operands are uniform among numbers of their digit count (one digit includes 0). Prompt and target:
`src/data/data_instance_processor/addition_instance_processor.py:53,61` (no separator,
`configs/data/s2s_addition.jsonnet`).
"""

from __future__ import annotations

import re

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic.base import (
    AlgorithmicTask,
    Example,
    match,
    number_to_string,
    random_number,
    string_to_number,
)

PROMPT = re.compile(r"Compute ([\d ]+) \+ ([\d ]+) \?")


def answer_text(total: int) -> str:
    return f" The answer is {number_to_string(total)}."


def bins_of_length(length: int, least: int) -> int:
    """Operand-length pairs (a, b) with max(a, b) = `length` and both >= `least` (a `least` above `length` counts as
    `length`: the one pair (length, length))."""
    return 2 * (length - min(least, length)) + 1


def operand_digits(rng: np.random.Generator, length: int, least: int) -> tuple[int, int]:
    """One of the `bins_of_length(length, least)` pairs, uniformly: index i < length - least + 1 is (length, least + i),
    the others (least + i - (length - least + 1), length)."""
    low = min(least, length)
    i = int(rng.integers(0, bins_of_length(length, least)))
    span = length - low + 1  # the pairs with a = length
    return (length, low + i) if i < span else (low + i - span, length)


@register
class Addition(AlgorithmicTask):
    name = "addition"
    summary = "a + b, digit by digit"
    unit = "digits"
    train_min = 4  # make_addition_dataset.py --train_min
    reference = "scripts/dataset_builders/make_addition_dataset.py"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        """An example of the builder's default split (operands of at least `train_min` digits, or `length`)."""
        return cls.sample_in(rng, length, cls.train_min)

    @classmethod
    def sample_in(cls, rng: np.random.Generator, length: int, least: int) -> Example:
        a, b = (random_number(rng, d) for d in operand_digits(rng, length, least))
        return Example(f"Compute {number_to_string(a)} + {number_to_string(b)} ?", answer_text(a + b), length)

    @classmethod
    def length_weight(cls, length: int, least: int) -> int:
        return bins_of_length(length, least)

    @classmethod
    def solve(cls, prompt: str) -> str:
        found = match(PROMPT, prompt, cls.name)
        return answer_text(string_to_number(found.group(1)) + string_to_number(found.group(2)))
