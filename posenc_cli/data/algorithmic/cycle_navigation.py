"""`cycle_navigation` (regular): the final position of a walk on a cycle of 5 states.

`cycle_navigation: 2 0 1 0 0 =` -> ` 3`; n actions uniform in {0, 1, 2} = a step of −1, 0, +1 from state 0, the
output the sum of the steps mod 5 (google-deepmind/randomized_positional_encodings 57bc5d0,
`tasks/regular/cycle_navigation.py:52-62`). Layout, lengths and the decoder's difference from the reference's
encoder: `_chomsky`.
"""

from __future__ import annotations

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic._chomsky import REFERENCE, answer, example, read_inputs
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example

CYCLE = 5


@register
class CycleNavigation(AlgorithmicTask):
    name = "cycle_navigation"
    summary = "the final state of a walk of -1/0/+1 steps on a 5-cycle (Chomsky: regular)"
    unit = "steps"
    train_min = 1
    reference = REFERENCE + "regular/cycle_navigation.py"
    suite = "synthetic"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        actions = rng.integers(0, 3, size=length)
        return example(cls.name, actions.tolist(), [int(np.sum(actions - 1) % CYCLE)], length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        state = 0
        for action in read_inputs(cls.name, prompt, "012"):  # one step of the walk per action
            state = (state + {"0": CYCLE - 1, "1": 0, "2": 1}[action]) % CYCLE
        return answer([state])
