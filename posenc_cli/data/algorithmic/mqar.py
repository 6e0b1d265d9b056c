"""`mqar`: multi-query associative recall (Arora et al., "Zoology", ICLR 2024, arXiv 2312.04927), scored at every
query.

Layout (HazyResearch/zoology d88d6f5, `zoology/data/multiquery_ar.py:88-137`): a context of `kv` key–value pairs
`k1 v1 k2 v2 …` with distinct keys and distinct values, then a query region of `space` two-token slots; `kv` of the
slots, at gaps g drawn without replacement with P(g) ∝ a·(g+1)^(a−1) (a = `power_a` = 0.01, so most queries sit right
after the context), hold a key of the context (each key once, key i at gap g_i) and the slot's second position is
where its value is predicted; the other slots hold the filler token 0 twice (`random_non_queries=False`, Figure 2's
setting, `zoology/experiments/paper_configs/iclr24_zoology_figure2/configs.py:31-36`). Zoology scores the value at
each query (labels −100 elsewhere) and averages the per-example share of right values (`zoology/train.py:210-224`).

Scaled to posenc's byte-level text: Zoology's vocabulary of 8,192 ids (keys [1, 4096), values [4096, 8192)) becomes
26 keys `a`–`z` and 26 values `A`–`Z`, the filler is `0`, and each Zoology token is one character after a space, so
a sequence of Zoology length L is `MQAR:` plus 2L bytes: `MQAR: a B c D 0 0 c D 0 0 a B`. In a decoder the value of
a query is the next token after its key, so it sits in the input where Zoology's input holds a 0 (Zoology hides it;
the keys are distinct, so a seen value tells nothing of another key's value beyond excluding itself). The document
ends with the last query's value (trailing filler slots change no earlier prediction); the values are the scored
pieces (`Example.scored`), each scored teacher-forced by `eval-algorithmic`.

Length: the instance length n is the number of query slots (`space`), with kv = min(4, n) pairs, so Zoology length
L = 2·kv + 2n: Figure 2's (L, kv) = (64, 4) is n = 28, (128, 4) is 60, (256, 4) is 124. Zoology trains one length
(`train_min` = 28 here: `data.max_length=28` trains exactly its (64, 4) cell) and ships no runnable length split
(`zoology/data/ar_extrapolate.py` imports functions removed in 194a712), so beyond-L is posenc's own: the same kv and
power_a at more slots (n = 60, 124), where only the query–key distances grow.
"""

from __future__ import annotations

import re
import string

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic._scored import pieces_of, scored_example
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example, match

KEYS = string.ascii_lowercase  # Zoology's keys [1, V/2), scaled to 26
VALUES = string.ascii_uppercase  # Zoology's values [V/2, V), scaled to 26
FILLER = "0"  # a non-query token (random_non_queries=False)
KV_PAIRS = 4  # Figure 2's kv at L = 64, and posenc's split at every length
POWER_A = 0.01  # zoology MQARConfig.power_a default (Figure 2 passes 0.01)
HEADER = "MQAR:"
PROMPT = re.compile(r"MQAR:((?: [a-zA-Z0])*) ([a-z])")


def gap_probabilities(space: int, power_a: float = POWER_A) -> np.ndarray:
    """P(g) ∝ a·(g+1)^(a−1) over the gaps g = 0..space−1 (`multiquery_ar.py:115-118`)."""
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    return p / p.sum()


def layout(rng: np.random.Generator, slots: int, kv: int) -> tuple[list[str], set[int]]:
    """Zoology's tokens of one example (context then `slots` query slots, cut after the last query's value) and the
    indices of the scored tokens (the values after the queries)."""
    keys = [KEYS[i] for i in rng.choice(len(KEYS), size=kv, replace=False)]
    values = [VALUES[i] for i in rng.choice(len(VALUES), size=kv, replace=False)]
    gaps = rng.choice(slots, size=kv, replace=False, p=gap_probabilities(slots))  # gap of key i
    tokens = [t for pair in zip(keys, values, strict=True) for t in pair]
    region = [FILLER] * (2 * (int(gaps.max()) + 1))  # (2·slots,) cut after the last query
    for key, value, gap in zip(keys, values, gaps.tolist(), strict=True):
        region[2 * gap : 2 * gap + 2] = [key, value]
    scored = {len(tokens) + 2 * g + 1 for g in gaps.tolist()}
    return tokens + region, scored


@register
class MultiQueryAssociativeRecall(AlgorithmicTask):
    name = "mqar"
    summary = "recall the value of each queried key (Zoology's MQAR), scored at every query"
    unit = "query slots"
    train_min = 28  # Zoology Figure 2's (L, kv) = (64, 4): 28 slots
    reference = "HazyResearch/zoology d88d6f5 zoology/data/multiquery_ar.py"
    suite = "synthetic"
    reference_metric = "token_accuracy"  # Zoology's per-query accuracy (zoology/train.py:210-224)

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        tokens, scored = layout(rng, length, min(KV_PAIRS, length))
        return scored_example(pieces_of(HEADER, ((t, i in scored) for i, t in enumerate(tokens))), length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        """The value of the key that ends `prompt`, read off the context: the leading pairs of distinct keys."""
        found = match(PROMPT, prompt, cls.name)
        tokens = found.group(1).split()
        context: dict[str, str] = {}
        for key, value in zip(tokens[::2], tokens[1::2], strict=False):
            if key not in KEYS or key in context:
                break
            context[key] = value
        if found.group(2) not in context:
            raise ValueError(f"not a {cls.name} prompt: the key {found.group(2)!r} is not in its context")
        return f" {context[found.group(2)]}"
