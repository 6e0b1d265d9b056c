"""`summation` (the reference's `s2s_sum`): the sum of single-digit numbers, modulo 10.

`Compute: 4 + 9 + 1 .[SEP]` -> ` The answer is 4 .`; length = the number of terms, each uniform in 1..9
(McGill-NLP/length-generalization 40f8a44, `scripts/dataset_builders/make_sum_dataset.py:33-47`), the answer modulo
`modulo_factor` = 10 (`configs/data/s2s_sum.jsonnet`, also its separator `[SEP] `, which follows the prompt's final
`.` with no space). Prompt and target: `src/data/data_instance_processor/sum_instance_processor.py:129,137`; the
reference's document is `Compute: 4 + 9 + 1 .[SEP] The answer is 4 .`, and so is this one.
"""

from __future__ import annotations

import re

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example, match, number_to_string

MODULO = 10  # configs/data/s2s_sum.jsonnet modulo_factor
PROMPT = re.compile(r"Compute: (\d(?: \+ \d)*) \.\[SEP\]")


def answer_text(total: int) -> str:
    return f" The answer is {number_to_string(total % MODULO)} ."


@register
class Summation(AlgorithmicTask):
    name = "summation"
    summary = "the sum of digits 1..9, modulo 10"
    train_min = 4  # make_sum_dataset.py --train_min
    reference = "scripts/dataset_builders/make_sum_dataset.py"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        values = rng.integers(1, 10, size=length).tolist()
        prompt = f"Compute: {' + '.join(map(str, values))} .[SEP]"
        return Example(prompt, answer_text(sum(values)), length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        values = match(PROMPT, prompt, cls.name).group(1).split(" + ")
        return answer_text(sum(int(v) for v in values))
