"""`sorting` (the reference's `s2s_sort`, split `sngd`: single-digit items): a list of symbols in sorted order.

`Sort the following list [ q, 3, B ].` -> ` The sorted list is [ 3, B, q ].`; length = the number of items. The
reference draws items uniformly from 50 tokens and sorts them by their rank (McGill-NLP/length-generalization 40f8a44,
`scripts/dataset_builders/make_sort_dataset.py:74-90`); here the 50 are `SORT_SYMBOLS`, ranked in ASCII order.
Prompt and target: `src/data/data_instance_processor/sort_instance_processor.py:56,65` (no separator).
"""

from __future__ import annotations

import re

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic.base import SORT_SYMBOLS, AlgorithmicTask, Example, match

PROMPT = re.compile(r"Sort the following list \[ (.+) \]\.")


def answer_text(items: list[str]) -> str:
    return f" The sorted list is [ {', '.join(items)} ]."


@register
class Sorting(AlgorithmicTask):
    name = "sorting"
    summary = "the list of symbols sorted"
    train_min = 4  # make_sort_dataset.py --train_min
    reference = "scripts/dataset_builders/make_sort_dataset.py (single_digit)"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        ranks = np.sort(rng.integers(0, len(SORT_SYMBOLS), size=length))  # the sorted order of the draws
        items = [SORT_SYMBOLS[i] for i in rng.permutation(ranks)]
        prompt = f"Sort the following list [ {', '.join(items)} ]."
        return Example(prompt, answer_text([SORT_SYMBOLS[i] for i in ranks]), length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        items = match(PROMPT, prompt, cls.name).group(1).split(", ")
        return answer_text(sorted(items, key=SORT_SYMBOLS.index))
