"""`modular_arithmetic` (regular): an expression of digits 0–4 and the operators + − · without brackets, mod 5.

`modular_arithmetic: 1 + 2 * 3 =` -> ` 2`; the reference's length n counts digits and operators and is made odd (an
even n gives n − 1 tokens; the example keeps the n asked); digits uniform in 0..4, operators uniform in {+, *, -};
products before sums, a `-` negating the term after it, the value mod 5 (google-deepmind/randomized_positional_encodings
57bc5d0, `tasks/regular/modular_arithmetic.py:163-199`; modulus 5 in `experiments/constants.py`). Layout, lengths and
the decoder's difference from the reference's encoder: `_chomsky`.
"""

from __future__ import annotations

import re

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic._chomsky import REFERENCE, answer, example, read_inputs
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example

MODULUS = 5
OPERATORS = "+*-"  # the reference's default operators ('+', '*', '-')


def value(tokens: list[str]) -> int:
    """The expression's value mod 5, read left to right with a running sum and the current signed product."""
    total, term = 0, int(tokens[0])
    for op, digit in zip(tokens[1::2], tokens[2::2], strict=True):
        if op == "*":
            term *= int(digit)
        else:
            total, term = total + term, int(digit) if op == "+" else -int(digit)
    return (total + term) % MODULUS


@register
class ModularArithmetic(AlgorithmicTask):
    name = "modular_arithmetic"
    summary = "an expression of digits 0-4 and + - * without brackets, mod 5 (Chomsky: regular)"
    unit = "tokens"
    train_min = 1
    reference = REFERENCE + "regular/modular_arithmetic.py"
    suite = "synthetic"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        odd = length if length % 2 else length - 1
        digits = rng.integers(0, MODULUS, size=odd // 2 + 1).astype(str).tolist()
        ops = [OPERATORS[i] for i in rng.integers(0, len(OPERATORS), size=odd // 2)]
        tokens = [digits[0], *(t for pair in zip(ops, digits[1:], strict=True) for t in pair)]
        return example(cls.name, tokens, [value(tokens)], length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        """Split into signed terms at + and -, multiply within each, sum (independent of `value`'s scan)."""
        expression = "".join(read_inputs(cls.name, prompt, "01234+*-"))
        if not re.fullmatch(r"[0-4](?:[-+*][0-4])*", expression):
            raise ValueError(f"not a {cls.name} prompt: {prompt!r}")
        total = 0
        for sign, term in re.findall(r"([-+]?)([0-4](?:\*[0-4])*)", expression):
            total += (-1 if sign == "-" else 1) * int(np.prod([int(d) for d in term.split("*")]))
        return answer([total % MODULUS])
