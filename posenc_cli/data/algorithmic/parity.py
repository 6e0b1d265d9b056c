"""`parity` (the reference's `s2s_parity`): whether a list of bits holds an even number of ones.

`Is the number of 1's even in the sequence [ 0, 1, 1 ] ?` -> ` The answer is Yes.`; length = the number of bits,
each uniform in {0, 1} (McGill-NLP/length-generalization 40f8a44,
`scripts/dataset_builders/make_parity_dataset.py:33-47`). Prompt and target (parity 0 -> Yes, 1 -> No):
`src/data/data_instance_processor/parity_instance_processor.py:14-21,55,64`.
"""

from __future__ import annotations

import re

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example, match

PROMPT = re.compile(r"Is the number of 1's even in the sequence \[ ([01](?:, [01])*) \] \?")


def answer_text(ones: int) -> str:
    return f" The answer is {'Yes' if ones % 2 == 0 else 'No'}."


@register
class Parity(AlgorithmicTask):
    name = "parity"
    summary = "is the number of ones even? (Yes/No)"
    unit = "bits"
    train_min = 3  # make_parity_dataset.py --train_min
    reference = "scripts/dataset_builders/make_parity_dataset.py"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        bits = rng.integers(0, 2, size=length).tolist()
        prompt = f"Is the number of 1's even in the sequence [ {', '.join(map(str, bits))} ] ?"
        return Example(prompt, answer_text(sum(bits)), length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        bits = match(PROMPT, prompt, cls.name).group(1).split(", ")
        return answer_text(bits.count("1"))
