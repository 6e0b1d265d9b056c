"""What the Chomsky-hierarchy tasks share (Delétang et al., ICLR 2023, arXiv 2207.02098; Ruoss et al., ACL 2023,
arXiv 2305.16843; google-deepmind/randomized_positional_encodings 57bc5d0, `tasks/`): text layout and parsing.

The reference feeds one-hot input tokens to an encoder, appends `output_length(n)` copies of an empty token and reads
the outputs at those positions (`experiments/utils.py:32-92`); its instance length n is the input's token count, its
splits train on n uniform in 1..40 and test 41..500 (`experiments/example.py:79-81, 126-129`). Posenc's text: the
task name, the input tokens each after a space, ` =` (the role of the empty tape: where the input ends) and, as the
answer, the output tokens each after a space; `even_pairs: 0 1 1 =` -> ` 1`. A token is written as the reference's
docstring writes it (its id's digit; modular arithmetic's operators and binary addition's `+` as characters), so n
reference tokens are 2n bytes. The termination token of binary addition and stack manipulation is written (`2`); the
zero padding after it, which the reference's accuracy masks (`tasks/task.py:47-57`), is not: the answer stops there.

The decoder differs from the reference's encoder (stated in docs/commands/synthetic-tasks.md): each output is
generated after the whole input and the outputs before it (greedy, `eval-algorithmic`), where the encoder reads
input and empty tape in both directions and no output sees another. Lengths: `train_min` 1, so
`data.max_length=40` trains the reference's 1..40 and `data.eval_max_length=500` (or 100 on a CPU) tests to its 500.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from posenc_cli.data.algorithmic.base import Example, match

REFERENCE = "google-deepmind/randomized_positional_encodings 57bc5d0 tasks/"


def example(name: str, inputs: Sequence[object], outputs: Sequence[object], length: int) -> Example:
    """`name: i1 i2 … =` -> ` o1 o2 …`."""
    return Example(f"{name}: {' '.join(map(str, inputs))} =", " " + " ".join(map(str, outputs)), length)


def read_inputs(name: str, prompt: str, alphabet: str) -> list[str]:
    """The input tokens of a prompt of task `name` whose tokens are characters of `alphabet`; else a ValueError."""
    token = f"[{re.escape(alphabet)}]"
    return match(re.compile(rf"{name}: ({token}(?: {token})*) ="), prompt, name).group(1).split(" ")


def answer(outputs: Sequence[object]) -> str:
    return " " + " ".join(map(str, outputs))
