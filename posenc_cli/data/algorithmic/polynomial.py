"""`polynomial` (the reference's `s2s_poly`): a polynomial evaluated at a point, modulo 10.

`Evaluate at x = - 2 in 3 * x ** 2 + - 1 * x ** 0 ?` -> ` The answer is 1.` (3 · 4 - 1 = 11, modulo 10);
length = the number of terms. Coefficients uniform in -3..3, degrees in 0..3, x in -2..2
(McGill-NLP/length-generalization 40f8a44, `scripts/dataset_builders/make_poly_dataset.py:33-56`); the answer modulo
`modulo_factor` = 10 (`configs/data/s2s_poly.jsonnet`; Python's `%`, so in 0..9). Prompt and target:
`src/data/data_instance_processor/poly_instance_processor.py:49-66` (no separator).
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
    string_to_number,
)

MODULO = 10  # configs/data/s2s_poly.jsonnet modulo_factor
NUMBER = r"-? ?\d"
TERM = rf"{NUMBER} \* x \*\* \d"
PROMPT = re.compile(rf"Evaluate at x = ({NUMBER}) in ({TERM}(?: \+ {TERM})*) \?")
TERM_PARTS = re.compile(rf"({NUMBER}) \* x \*\* (\d)")


def answer_text(value: int) -> str:
    return f" The answer is {number_to_string(value % MODULO)}."


@register
class Polynomial(AlgorithmicTask):
    name = "polynomial"
    summary = "a polynomial of `length` terms at x, modulo 10"
    unit = "terms"
    train_min = 4  # make_poly_dataset.py --train_min
    reference = "scripts/dataset_builders/make_poly_dataset.py"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        coeffs = rng.integers(-3, 4, size=length).tolist()
        degrees = rng.integers(0, 4, size=length).tolist()
        x = int(rng.integers(-2, 3))
        pairs = list(zip(coeffs, degrees, strict=True))
        terms = " + ".join(f"{number_to_string(c)} * x ** {number_to_string(d)}" for c, d in pairs)
        value = sum(c * x**d for c, d in pairs)
        return Example(f"Evaluate at x = {number_to_string(x)} in {terms} ?", answer_text(value), length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        found = match(PROMPT, prompt, cls.name)
        x = string_to_number(found.group(1))
        terms = TERM_PARTS.findall(found.group(2))
        return answer_text(sum(string_to_number(c) * x ** int(d) for c, d in terms))
