"""`common-words` (RULER CWE, `scripts/synthetic.yaml` cwe; NVIDIA/RULER c3f5e3b
`scripts/data/synthetic/common_words_extraction.py`): a numbered list of words, `common` of them repeated
`common_freq` times and every other word `uncommon_freq` times, shuffled; return the common words.

Defaults are RULER's short-context configuration, the one that fits posenc's tiny windows: 10 common words
(`num_cw`, line 63) repeated 6 times among others repeated once (`get_example(num_words, 6, 1)` when
`max_seq_length < 4096`, line 106; from 4K on RULER asks 30 / 3, `synthetic.yaml`). The list is numbered
"1. word 2. word ..." (line 96) and fills the prompt: as many other words as fit (RULER's binary search over the
word count, lines 146-169). Words come from a fixed list of common English nouns, then pronounceable made-up words
once it is used up (RULER: wonderwords nouns, adjectives and verbs, then the randle English words, lines 72-89).
RULER's generation budget is 120 tokens (`constants.py` 'common_words_extraction'); it scores `string_match_all`
(`scripts/eval/synthetic/constants.py:40`). Deviations: the instruction and few-shot example (line 102) are left
out and the question is shortened to fit a tiny window; the list has no depth (cells record depth None).
"""

from __future__ import annotations

import numpy as np

from posenc_cli.data.ruler import register
from posenc_cli.data.ruler.base import RULER_SIZES, ContextTask, Draft, Episode, Sizes, context_episode

_LIST = (
    "apple", "arrow", "badge", "baker", "banjo", "barn", "beach", "bean", "bear", "bell", "bench", "berry", "bird",
    "blade", "blanket", "boat", "bone", "book", "boot", "bottle", "bowl", "box", "branch", "bread", "brick", "bridge",
    "brush", "bucket", "button", "cabin", "cable", "cake", "camel", "camera", "candy", "canoe", "cape", "card",
    "carpet", "carrot", "cart", "castle", "cat", "chair", "chalk", "cheese", "cherry", "chest", "chicken", "cloak",
    "clock", "cloud", "coal", "coat", "coin", "comb", "cookie", "corn", "cotton", "couch", "cow", "crab", "crayon",
    "crown", "cup", "curtain", "daisy", "desk", "diamond", "dish", "dog", "doll", "door", "dove", "drum", "duck",
    "eagle", "egg", "engine", "fan", "feather", "fence", "fern", "field", "finger", "fish", "flag", "flame", "flower",
    "flute", "fog", "fork", "fox", "frog", "garden", "gate", "gift", "glass", "glove", "goat", "grape", "grass",
    "guitar", "hammer", "harp", "hat", "hawk", "helmet", "hill", "honey", "hook", "horse", "house", "island", "jacket",
    "jar", "jelly", "jewel", "kettle", "key", "kite", "knife", "ladder", "lake", "lamp", "leaf", "lemon", "letter",
    "lily", "lion", "lock", "map", "marble", "mask", "meadow", "melon", "mirror", "monkey", "moon", "mountain", "mouse",
    "mug", "nail", "needle", "nest", "net", "nut", "oak", "ocean", "olive", "onion", "orange", "owl", "paint", "palace",
    "pan", "paper", "parrot", "peach", "pear", "pearl", "pen", "pencil", "pepper", "piano", "pickle", "pig", "pillow",
    "pine", "pipe", "plate", "plum", "pocket", "pond", "pony", "pot", "potato", "puppy", "quilt", "rabbit", "radio",
    "rain", "ribbon", "ring", "river", "road", "robe", "rock", "roof", "rope", "rose", "sail", "salt", "sand", "saucer",
    "scarf", "seed", "shell", "ship", "shoe", "shovel", "silk", "sink", "skate", "sled", "snail", "snake", "sock",
    "sofa", "spoon", "star", "stone", "stove", "straw", "sugar", "sun", "swan", "table", "tent", "tiger", "toast",
    "tooth", "towel", "tower", "toy", "train", "tree", "truck", "tulip", "turtle", "umbrella", "valley", "vase",
    "violin", "wagon", "wall", "wand", "whale", "wheel", "whistle", "window", "wolf", "wool", "yarn", "zebra",
)  # fmt: skip
# none inside another ("pen" in "pencil"), so RULER's containment score cannot find a common word in another one
WORDS = tuple(w for w in _LIST if not any(w != o and w in o for o in _LIST))
_REAL = frozenset(WORDS)
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
QUESTION = " What are the {n} most common words in the list? The {n} most common words are"


SYLLABLES = [c + v for c in CONSONANTS for v in VOWELS]  # 70
STRIDE = 104_729  # a prime, coprime to 70³: index i visits candidate (i · STRIDE) mod 70³, each once, spread out
_MADE_UP: list[str] = []  # the made-up words found so far, in order
_NEXT = [0]  # the next candidate index


def made_up_words(n: int) -> list[str]:
    """The first `n` pronounceable three-syllable words (consonant-vowel ×3, in a fixed order) that hold no word of
    `WORDS` (about 334,000 exist), found as far as asked."""
    total = len(SYLLABLES) ** 3
    while len(_MADE_UP) < n and _NEXT[0] < total:
        a, rest = divmod(_NEXT[0] * STRIDE % total, len(SYLLABLES) ** 2)
        w = SYLLABLES[a] + SYLLABLES[rest // len(SYLLABLES)] + SYLLABLES[rest % len(SYLLABLES)]
        _NEXT[0] += 1
        if not any(w[i:j] in _REAL for i in range(len(w)) for j in range(i + 3, len(w) + 1)):
            _MADE_UP.append(w)
    return _MADE_UP[:n]


@register
class CommonWords(ContextTask):
    name = "common-words"
    summary = "a numbered word list, `common` words × `common_freq` among others × `uncommon_freq`; return the common"
    size_names = ("common", "common_freq", "uncommon_freq")
    tokens_to_generate = 120  # RULER scripts/data/synthetic/constants.py 'common_words_extraction'
    has_depth = False

    @classmethod
    def draft(
        cls, rng: np.random.Generator, depth: float, sizes: Sizes = RULER_SIZES, room: int | None = None
    ) -> Draft:
        order = [WORDS[i] for i in rng.permutation(len(WORDS))]
        common, others = order[: sizes.common], order[sizes.common :]
        shuffle_seed = int(rng.integers(0, 1 << 63))

        def make(n: int) -> Episode:
            chosen = others[:n] + (made_up_words(n - len(others)) if n > len(others) else [])
            words = common * sizes.common_freq + chosen * sizes.uncommon_freq
            order = np.random.default_rng(shuffle_seed).permutation(len(words))
            context = "".join(f" {i + 1}. {words[k]}" for i, k in enumerate(order))
            return context_episode(context, QUESTION.format(n=sizes.common), common)

        def what(n: int) -> str:
            return f"{sizes.common} common words ×{sizes.common_freq} and {n} other ×{sizes.uncommon_freq}"

        return Draft(make, 1, what)
