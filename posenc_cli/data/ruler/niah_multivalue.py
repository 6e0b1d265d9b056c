"""`niah-multivalue` (RULER MV-NIAH): one key inserted with several values; return all of them (in order)."""

from __future__ import annotations

import numpy as np

from posenc_cli.data.ruler import register
from posenc_cli.data.ruler.base import DEFAULT_DIGITS, Episode, RetrievalTask, later_depths, random_keys, random_values
from posenc_cli.data.ruler.niah_single import NEEDLE

VALUES = 3
QUESTION = " What are all the {key} keys? The {key} keys are"


@register
class NiahMultivalue(RetrievalTask):
    name = "niah-multivalue"
    summary = f"one key with {VALUES} values (the first at the depth, the others after it); return all"

    @classmethod
    def sample(cls, rng: np.random.Generator, depth: float, digits: int = DEFAULT_DIGITS) -> Episode:
        (key,) = random_keys(rng, 1)
        values = random_values(rng, VALUES, digits)
        needles = tuple(NEEDLE.format(key=key, value=v) for v in values)
        depths = (depth, *later_depths(rng, depth, VALUES - 1))
        return Episode(needles, depths, QUESTION.format(key=key), tuple(values))
