"""`stack_manipulation` (deterministic context-free): the final stack after POP / PUSH 0 / PUSH 1 actions.

`stack_manipulation: 0 1 1 0 4 2 2 =` -> ` 1 1 0 2`: a stack of bits given bottom to top (its length uniform in
1..n−1; n = 1: one bit, no action), then actions uniform in 2 = POP (ignored on an empty stack), 3 = PUSH 0,
4 = PUSH 1; the output the final stack top to bottom and the termination token 2 (the reference pads with zeros to
n + 1 and masks them; here the answer stops) (google-deepmind/randomized_positional_encodings 57bc5d0,
`tasks/dcf/stack_manipulation.py:55-118`). Layout, lengths and the decoder's difference from the reference's
encoder: `_chomsky`.
"""

from __future__ import annotations

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic._chomsky import REFERENCE, answer, example, read_inputs
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example

TERMINATION = 2


@register
class StackManipulation(AlgorithmicTask):
    name = "stack_manipulation"
    summary = "the final stack (top first) after POP/PUSH actions on a bit stack (Chomsky: context-free)"
    unit = "tokens"
    train_min = 1
    reference = REFERENCE + "dcf/stack_manipulation.py"
    suite = "synthetic"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        if length == 1:
            bit = int(rng.integers(0, 2))
            return example(cls.name, [bit], [bit, TERMINATION], length)
        depth = int(rng.integers(1, length))
        stack = rng.integers(0, 2, size=depth).tolist()
        actions = rng.integers(2, 5, size=length - depth).tolist()
        final = list(stack)
        for action in actions:  # one step per action
            if action == 2:
                final = final[:-1]
            else:
                final.append(action - 3)
        return example(cls.name, stack + actions, [*final[::-1], TERMINATION], length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        tokens = read_inputs(cls.name, prompt, "01234")
        split = next((i for i, t in enumerate(tokens) if t in "234"), len(tokens))
        if any(t in "01" for t in tokens[split:]):
            raise ValueError(f"not a {cls.name} prompt: a stack bit after an action: {prompt!r}")
        top_first = tokens[:split][::-1]  # the stack read from its top
        for action in tokens[split:]:
            top_first = top_first[1:] if action == "2" else ["0" if action == "3" else "1", *top_first]
        return answer([*top_first, TERMINATION])
