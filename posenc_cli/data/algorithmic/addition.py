"""`addition` (the reference's `s2s_addition`): the sum of two numbers written digit by digit.

`Compute 4 0 7 + 9 5 ?` -> ` The answer is 5 0 2.`; length = the digits of the longer operand. The reference bins
examples by the pair of operand lengths (`a-by-b`), training on every pair with both lengths <= L and testing on the
pairs where at least one is in L+1..2L (McGill-NLP/length-generalization 40f8a44,
`scripts/dataset_builders/make_addition_dataset.py:34-62,93-138`); a length-n example here has one operand of n digits
(first or second, even odds) and the other of a uniform 1..n digits, so lengths <= L cover exactly the training pairs
and length n > L the test pairs whose longer operand has n digits. Operands are uniform among numbers of their digit
count (one digit includes 0). Prompt and target: `src/data/data_instance_processor/addition_instance_processor.py:53,61`
(no separator, `configs/data/s2s_addition.jsonnet`).
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


@register
class Addition(AlgorithmicTask):
    name = "addition"
    summary = "a + b, digit by digit"
    unit = "digits"
    reference = "scripts/dataset_builders/make_addition_dataset.py"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        other = int(rng.integers(1, length + 1))
        digits = (length, other) if rng.random() < 0.5 else (other, length)
        a, b = (random_number(rng, d) for d in digits)
        return Example(f"Compute {number_to_string(a)} + {number_to_string(b)} ?", answer_text(a + b), length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        found = match(PROMPT, prompt, cls.name)
        return answer_text(string_to_number(found.group(1)) + string_to_number(found.group(2)))
