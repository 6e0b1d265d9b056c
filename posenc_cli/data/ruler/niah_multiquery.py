"""`niah-multiquery` (RULER MQ-NIAH): several needles, the question asks for the values of all their keys."""

from __future__ import annotations

import numpy as np

from posenc_cli.data.ruler import register
from posenc_cli.data.ruler.base import DEFAULT_DIGITS, Episode, RetrievalTask, random_keys, random_values
from posenc_cli.data.ruler.niah_single import NEEDLE

QUERIES = 2
QUESTION = " What are the {keys} keys? The {keys} keys are"


@register
class NiahMultiquery(RetrievalTask):
    name = "niah-multiquery"
    summary = f"{QUERIES} needles (the first at the depth, the others at uniform depths); return every value asked"

    @classmethod
    def sample(cls, rng: np.random.Generator, depth: float, digits: int = DEFAULT_DIGITS) -> Episode:
        keys = random_keys(rng, QUERIES)
        values = random_values(rng, QUERIES, digits)
        needles = tuple(NEEDLE.format(key=k, value=v) for k, v in zip(keys, values, strict=True))
        depths = (depth, *(float(d) for d in rng.random(QUERIES - 1)))
        return Episode(needles, depths, QUESTION.format(keys=" and ".join(keys)), tuple(values))
