"""`reverse` (the reference's `s2s_reverse`, split `mc`: multi_char): the list of symbols in reverse order.

`Reverse: a 7 Q [SEP]` -> ` Q 7 a`; length = the number of symbols. McGill-NLP/length-generalization 40f8a44,
`scripts/dataset_builders/make_reverse_dataset.py:71-92`,
`src/data/data_instance_processor/copy_instance_processor.py:40-42`,
separator `[SEP]` (`configs/data/s2s_reverse.jsonnet`).
"""

from __future__ import annotations

import re

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example, match, random_symbols

PROMPT = re.compile(r"Reverse: (.+) \[SEP\]")


@register
class Reverse(AlgorithmicTask):
    name = "reverse"
    summary = "the list of symbols reversed"
    train_min = 4  # make_reverse_dataset.py --train_min
    reference = "scripts/dataset_builders/make_reverse_dataset.py (multi_char)"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        items = random_symbols(rng, length)
        return Example(f"Reverse: {' '.join(items)} [SEP]", " " + " ".join(items[::-1]), length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        items = match(PROMPT, prompt, cls.name).group(1).split(" ")
        return " " + " ".join(reversed(items))
