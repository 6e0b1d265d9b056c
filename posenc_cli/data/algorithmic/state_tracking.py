"""`s5`, `a5`: state tracking as word problems on the permutation groups S5 and A5 (Merrill, Petty, Sabharwal, "The
Illusion of State in State-Space Models", ICML 2024, arXiv 2404.08819).

Reference (jopetty/word-problem 8f910f9, `src/generate_data.py:67-107`): an input of k group elements drawn uniformly
(`samples` set: without replacement from the |G|^k sequences, which at posenc's sizes is a uniform draw), and as
target the running products p_t = p_{t−1}·x_t from the identity; `src/main.py:553-568` (`tagging=True`) trains a
causal model to output p_t at every position t, and reports token and sequence accuracy (:642-649) on held-out
sequences of the longest training k (lengths 2..k trained, only k split 80/20: :164-179, 250-252).

Posenc's form: `S5: 10234 02143 =` -> ` 12043`, the final product p_k of the prompt's k elements. A decoder that
read p_{t−1} as a token before predicting p_t would solve a one-step lookup (p_t = p_{t−1}·x_t), which is why the
reference tags instead of generating; with text next-token prediction the only leak-free label is the last. In a
causal model position t sees exactly x_1..x_t, so the reference's per-position label p_t is the final product of
the length-t prefix: `eval-algorithmic`'s exact match at every length n is the reference's token accuracy at
position n (its sequence accuracy, all k positions right at once, is not measured). Training draws one label per
document where the reference gets k per sequence.

Scaled to posenc's byte text: the reference's element index (one token) is the permutation's one-line notation on
{0..4}, five digits after a space (`10234` swaps 0 and 1); the identity `01234` starts the product.
p·x applies p first, then x: (p·x)(i) = x(p(i)) (the reference's `G.op` order is unconfirmed; the groups' word
problems are equally hard either way). Lengths: k in 2..K trained (`train_min` 2, the data's least k; K =
`data.max_length`, e.g. 10), beyond-K = K+1..2K is posenc's own split (the reference never tests longer k).
"""

from __future__ import annotations

import itertools
import re
from functools import cache

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example, match

DEGREE = 5
IDENTITY = tuple(range(DEGREE))
Permutation = tuple[int, ...]


def compose(p: Permutation, x: Permutation) -> Permutation:
    """p·x: apply p, then x ((p·x)(i) = x(p(i)))."""
    return tuple(x[i] for i in p)


def is_even(p: Permutation) -> bool:
    """Whether `p` has an even number of inversions (an element of A_n)."""
    return sum(p[i] > p[j] for i, j in itertools.combinations(range(len(p)), 2)) % 2 == 0


@cache
def elements(group: str) -> tuple[Permutation, ...]:
    """The elements of S5 (all 120 permutations) or A5 (the 60 even ones), identity first (lexicographic order)."""
    every = tuple(itertools.permutations(range(DEGREE)))
    return every if group == "S5" else tuple(p for p in every if is_even(p))


def word(p: Permutation) -> str:
    return "".join(map(str, p))


class WordProblem(AlgorithmicTask):
    """The final product of k uniform elements of `group`; subclasses name S5 and A5."""

    group: str
    unit = "elements"
    train_min = 2  # generate_data.py: k from 2
    reference = "jopetty/word-problem 8f910f9 src/generate_data.py"
    suite = "synthetic"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        group = elements(cls.group)
        xs = [group[i] for i in rng.integers(0, len(group), size=length)]
        product = IDENTITY
        for x in xs:
            product = compose(product, x)
        prompt = f"{cls.group}: {' '.join(map(word, xs))} ="
        return Example(prompt, f" {word(product)}", length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        """Compose the prompt's permutations as index maps (independent of the generator's tuples)."""
        found = match(re.compile(rf"{cls.group}: ([0-4]{{5}}(?: [0-4]{{5}})*) ="), prompt, cls.name)
        state = list(range(DEGREE))  # state[i]: where i has gone so far
        for w in found.group(1).split():
            image = [int(c) for c in w]
            if sorted(image) != list(range(DEGREE)) or (cls.group == "A5" and not is_even(tuple(image))):
                raise ValueError(f"not a {cls.name} prompt: {w} is not in {cls.group}")
            state = [image[s] for s in state]
        return " " + "".join(map(str, state))


@register
class S5(WordProblem):
    name = "s5"
    summary = "the product of k permutations of S5 (state tracking, non-solvable group)"
    group = "S5"


@register
class A5(WordProblem):
    name = "a5"
    summary = "the product of k even permutations of A5 (state tracking, the smallest non-solvable group)"
    group = "A5"
