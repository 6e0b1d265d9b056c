"""`copy` (the reference's `s2s_copy`, split `cmc`: copy_multi_char): repeat a list of symbols.

`Copy: a 7 Q [SEP]` -> ` a 7 Q`; length = the number of symbols. McGill-NLP/length-generalization 40f8a44,
`scripts/dataset_builders/make_copy_dataset.py:137-157` (items uniform with replacement),
`src/data/data_instance_processor/copy_instance_processor.py:22-24` (prompt and target), separator `[SEP]`
(`configs/data/s2s_copy.jsonnet`).
"""

from __future__ import annotations

import re

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example, match, random_symbols

PROMPT = re.compile(r"Copy: (.+) \[SEP\]")


@register
class Copy(AlgorithmicTask):
    name = "copy"
    summary = "repeat the list of symbols"
    train_min = 4  # make_copy_dataset.py --train_min
    reference = "scripts/dataset_builders/make_copy_dataset.py (copy_multi_char)"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        items = " ".join(random_symbols(rng, length))
        return Example(f"Copy: {items} [SEP]", f" {items}", length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        items = match(PROMPT, prompt, cls.name).group(1).split(" ")
        return " " + " ".join(items)
