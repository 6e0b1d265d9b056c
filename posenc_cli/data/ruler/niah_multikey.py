"""`niah-multikey` (RULER MK-NIAH, `scripts/synthetic.yaml` niah_multikey_1: 4 keys): the asked needle among
distractor needles with other keys; return its value."""

from __future__ import annotations

import numpy as np

from posenc_cli.data.ruler import register
from posenc_cli.data.ruler.base import RULER_SIZES, Episode, RetrievalTask, Sizes, random_keys, random_values
from posenc_cli.data.ruler.niah_single import NEEDLE, QUESTION


@register
class NiahMultikey(RetrievalTask):
    name = "niah-multikey"
    summary = "the asked needle among `keys` - 1 with other keys (uniform depths)"
    size_names = ("keys", "digits")

    @classmethod
    def sample(cls, rng: np.random.Generator, depth: float, sizes: Sizes = RULER_SIZES) -> Episode:
        keys = random_keys(rng, sizes.keys)
        values = random_values(rng, sizes.keys, sizes.digits)
        needles = tuple(NEEDLE.format(key=k, value=v) for k, v in zip(keys, values, strict=True))
        depths = (depth, *(float(d) for d in rng.random(sizes.keys - 1)))
        return Episode(needles, depths, QUESTION.format(key=keys[0]), (values[0],))
