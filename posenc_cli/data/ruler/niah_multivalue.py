"""`niah-multivalue` (RULER MV-NIAH, `scripts/synthetic.yaml` niah_multivalue: 4 values): one key inserted with
several values; return all of them (in order)."""

from __future__ import annotations

import numpy as np

from posenc_cli.data.ruler import register
from posenc_cli.data.ruler.base import (
    RULER_SIZES,
    Episode,
    RetrievalTask,
    Sizes,
    later_depths,
    random_keys,
    random_values,
)
from posenc_cli.data.ruler.niah_single import NEEDLE

QUESTION = " What are all the {key} keys? The {key} keys are"


@register
class NiahMultivalue(RetrievalTask):
    name = "niah-multivalue"
    summary = "one key with `values` values (the first at the depth, the others after it); return all"
    size_names = ("values", "digits")

    @classmethod
    def sample(cls, rng: np.random.Generator, depth: float, sizes: Sizes = RULER_SIZES) -> Episode:
        (key,) = random_keys(rng, 1)
        values = random_values(rng, sizes.values, sizes.digits)
        needles = tuple(NEEDLE.format(key=key, value=v) for v in values)
        depths = (depth, *later_depths(rng, depth, sizes.values - 1))
        return Episode(needles, depths, QUESTION.format(key=key), tuple(values))
