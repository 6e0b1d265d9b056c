"""`variable-tracking` (RULER VT): a chain of assignments through the haystack, `VAR A = 1234.` then `VAR B = VAR A.`
...; return every variable that holds the value (in chain order)."""

from __future__ import annotations

import itertools

import numpy as np

from posenc_cli.data.ruler import register
from posenc_cli.data.ruler.base import DEFAULT_DIGITS, Episode, RetrievalTask, later_depths, random_names, random_values

HOPS = 2  # variables = HOPS + 1; RULER uses 4 hops at 4k+ tokens
VALUE = " VAR {name} = {value}."
ASSIGN = " VAR {name} = VAR {previous}."
QUESTION = " Which variables hold {value}? The variables holding {value} are"


@register
class VariableTracking(RetrievalTask):
    name = "variable-tracking"
    summary = f"a chain of {HOPS + 1} assignments (the value at the depth, each copy after it); return every name"

    @classmethod
    def sample(cls, rng: np.random.Generator, depth: float, digits: int = DEFAULT_DIGITS) -> Episode:
        names = random_names(rng, HOPS + 1)
        (value,) = random_values(rng, 1, digits)
        copies = (ASSIGN.format(name=n, previous=p) for p, n in itertools.pairwise(names))
        needles = (VALUE.format(name=names[0], value=value), *copies)
        depths = (depth, *later_depths(rng, depth, HOPS))
        return Episode(needles, depths, QUESTION.format(value=value), tuple(names))
