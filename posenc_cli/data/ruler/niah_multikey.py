"""`niah-multikey` (RULER MK-NIAH): the asked needle among distractor needles with other keys; return its value."""

from __future__ import annotations

import numpy as np

from posenc_cli.data.ruler import register
from posenc_cli.data.ruler.base import DEFAULT_DIGITS, Episode, RetrievalTask, random_keys, random_values
from posenc_cli.data.ruler.niah_single import NEEDLE, QUESTION

DISTRACTORS = 2  # RULER uses 3 at 4k+ tokens; 2 keep an episode within 128 byte tokens


@register
class NiahMultikey(RetrievalTask):
    name = "niah-multikey"
    summary = f"the asked needle among {DISTRACTORS} with other keys (uniform depths)"

    @classmethod
    def sample(cls, rng: np.random.Generator, depth: float, digits: int = DEFAULT_DIGITS) -> Episode:
        keys = random_keys(rng, 1 + DISTRACTORS)
        values = random_values(rng, 1 + DISTRACTORS, digits)
        needles = tuple(NEEDLE.format(key=k, value=v) for k, v in zip(keys, values, strict=True))
        depths = (depth, *(float(d) for d in rng.random(DISTRACTORS)))
        return Episode(needles, depths, QUESTION.format(key=keys[0]), (values[0],))
