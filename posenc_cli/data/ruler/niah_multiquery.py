"""`niah-multiquery` (RULER MQ-NIAH, `scripts/synthetic.yaml` niah_multiquery: 4 queries): several needles, the
question asks for the values of all their keys."""

from __future__ import annotations

import numpy as np

from posenc_cli.data.ruler import register
from posenc_cli.data.ruler.base import RULER_SIZES, Episode, RetrievalTask, Sizes, random_keys, random_values
from posenc_cli.data.ruler.niah_single import NEEDLE

QUESTION = " What are the {keys} keys? The {keys} keys are"


@register
class NiahMultiquery(RetrievalTask):
    name = "niah-multiquery"
    summary = "`queries` needles (the first at the depth, the others at uniform depths); return every value asked"
    size_names = ("queries", "digits")

    @classmethod
    def sample(cls, rng: np.random.Generator, depth: float, sizes: Sizes = RULER_SIZES) -> Episode:
        keys = random_keys(rng, sizes.queries)
        values = random_values(rng, sizes.queries, sizes.digits)
        needles = tuple(NEEDLE.format(key=k, value=v) for k, v in zip(keys, values, strict=True))
        depths = (depth, *(float(d) for d in rng.random(sizes.queries - 1)))
        return Episode(needles, depths, QUESTION.format(keys=" and ".join(keys)), tuple(values))
