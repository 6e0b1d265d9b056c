"""`variable-tracking` (RULER VT, `scripts/synthetic.yaml` vt: 1 chain of 4 hops): a chain of assignments through
the haystack, `VAR ABCDE = 12345.` then `VAR FGHIJ = VAR ABCDE.` ...; return every variable that holds the value (in
chain order). RULER's generation budget for VT is 30 tokens (`scripts/data/synthetic/constants.py`)."""

from __future__ import annotations

import itertools

import numpy as np

from posenc_cli.data.ruler import register
from posenc_cli.data.ruler.base import (
    RULER_SIZES,
    Episode,
    RetrievalTask,
    Sizes,
    later_depths,
    random_names,
    random_values,
)

VALUE = " VAR {name} = {value}."
ASSIGN = " VAR {name} = VAR {previous}."
QUESTION = " Which variables hold {value}? The variables holding {value} are"


@register
class VariableTracking(RetrievalTask):
    name = "variable-tracking"
    summary = "a chain of `hops` + 1 assignments (the value at the depth, each copy after it); return every name"
    size_names = ("hops", "vt_digits", "letters")
    tokens_to_generate = 30  # RULER scripts/data/synthetic/constants.py 'variable_tracking'

    @classmethod
    def sample(cls, rng: np.random.Generator, depth: float, sizes: Sizes = RULER_SIZES) -> Episode:
        names = random_names(rng, sizes.hops + 1, sizes.letters)
        (value,) = random_values(rng, 1, sizes.vt_digits)
        copies = (ASSIGN.format(name=n, previous=p) for p, n in itertools.pairwise(names))
        needles = (VALUE.format(name=names[0], value=value), *copies)
        depths = (depth, *later_depths(rng, depth, sizes.hops))
        return Episode(needles, depths, QUESTION.format(value=value), tuple(names))
