"""`kv-retrieval`: synthetic key-value retrieval after "Lost in the Middle" (Liu et al., TACL 2024, §4): a JSON
object of random key-value pairs; return the value of the asked key, which sits at a controlled depth of the object.

Liu et al. draw UUID keys and values (32 hex digits) and vary the number of pairs (75, 140, 300) and the position of
the asked pair; accuracy is U-shaped in that position. posenc sizes both to its byte tokenizer and 128-2048-token
windows: `hex_digits` (8 by default) per key and value, and as many pairs as fit the prompt, so the depth × length
heatmap of the needle tasks applies. The asked pair is pair round(depth · (n − 1)) of n (depth 0: the first, 1: the
last). The generation budget is RULER's for retrieving one value, 128 tokens (`constants.py` 'niah'), scored by
`string_match_all`. Deviations: Liu et al.'s instruction ("Extract the value corresponding to the specified key in
the JSON object below.") is shortened to the answer prefix below; keys are distinct, values may repeat.
"""

from __future__ import annotations

import numpy as np

from posenc_cli.data.ruler import register
from posenc_cli.data.ruler.base import RULER_SIZES, ContextTask, Draft, Episode, Sizes, context_episode

QUESTION = ' What is the value of "{key}"? The value of "{key}" is'
HEX = "0123456789abcdef"


def hex_string(rng: np.random.Generator, digits: int) -> str:
    return "".join(HEX[i] for i in rng.integers(0, 16, size=digits))


def hex_strings(rng: np.random.Generator, n: int, digits: int) -> list[str]:
    """`n` random strings of `digits` hex digits, drawn at once."""
    table = np.frombuffer(HEX.encode(), dtype=np.uint8)[rng.integers(0, 16, size=(n, digits))]  # (n, digits)
    return [row.tobytes().decode() for row in table]


def query_index(depth: float, n: int) -> int:
    """The asked pair of `n`: round(depth · (n − 1))."""
    return round(depth * (n - 1))


@register
class KvRetrieval(ContextTask):
    name = "kv-retrieval"
    summary = "a JSON object of hex key-value pairs (the asked pair at the depth); return the asked value"
    size_names = ("hex_digits",)
    tokens_to_generate = 128  # RULER scripts/data/synthetic/constants.py 'niah' (one value retrieved)

    @classmethod
    def draft(
        cls, rng: np.random.Generator, depth: float, sizes: Sizes = RULER_SIZES, room: int | None = None
    ) -> Draft:
        key, value = hex_string(rng, sizes.hex_digits), hex_string(rng, sizes.hex_digits)
        pairs_seed = int(rng.integers(0, 1 << 63))

        def make(n: int) -> Episode:
            other = np.random.default_rng(pairs_seed)
            keys: dict[str, str] = {}
            while len(keys) < n - 1:  # distinct keys, none the asked one (a repeat is redrawn: 16^-digits odds)
                draws = hex_strings(other, 2 * (n - 1 - len(keys)), sizes.hex_digits)
                for k, v in zip(draws[0::2], draws[1::2], strict=True):
                    if k != key and k not in keys:
                        keys[k] = v
            pairs = list(keys.items())
            pairs.insert(query_index(depth, n), (key, value))
            context = " JSON data: {" + ", ".join(f'"{k}": "{v}"' for k, v in pairs) + "}"
            return context_episode(context, QUESTION.format(key=key), (value,))

        def what(n: int) -> str:
            return f"{n} key-value pairs"

        return Draft(make, 2, what)
