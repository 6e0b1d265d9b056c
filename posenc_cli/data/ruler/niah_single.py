"""`niah-single` (RULER S-NIAH, `scripts/synthetic.yaml` niah_single_1): one key–value needle in the haystack; return
the value."""

from __future__ import annotations

import numpy as np

from posenc_cli.data.ruler import register
from posenc_cli.data.ruler.base import RULER_SIZES, Episode, RetrievalTask, Sizes, random_keys, random_values

NEEDLE = " The {key} key is {value}."
QUESTION = " What is the {key} key? The {key} key is"  # RULER's answer prefix restates the needle's lead


@register
class NiahSingle(RetrievalTask):
    name = "niah-single"
    summary = "one needle; return its value"

    @classmethod
    def sample(cls, rng: np.random.Generator, depth: float, sizes: Sizes = RULER_SIZES) -> Episode:
        (key,), (value,) = random_keys(rng, 1), random_values(rng, 1, sizes.digits)
        return Episode((NEEDLE.format(key=key, value=value),), (depth,), QUESTION.format(key=key), (value,))
