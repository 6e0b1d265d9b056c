"""What every retrieval task shares (RULER, Hsieh et al. 2024): episodes, haystacks, prompts, scoring.

An episode is a list of needle sentences, each with its depth (the share of the haystack before it), a question
and the expected answers. Rendered, it is

    <eod> <haystack[:b1]> <needle 1> <haystack[b1:b2]> <needle 2> ... <haystack[bk:n]> <question> <answer>

with b_i = round(depth_i · n) haystack units (characters for training text, tokens for evaluation prompts); needles
at the same position keep their order in the episode. The haystack is a repeated filler (RULER's "noise") or real
text (a slice of a corpus). The question ends with RULER's answer prefix, which restates the needle's lead
(" ... The apple key is"), so the answer continues a phrase seen in the haystack. Every piece starts with a space and
ends without one, so byte-level BPE cuts the joined text where it cuts the pieces one by one. The answer text is the
answers joined by ", " after a space.

Scoring follows RULER (NVIDIA/RULER c3f5e3b) by default: `scripts/eval/synthetic/constants.py:28` `string_match_all`,
the share of expected answers contained (case-insensitive) in the generated continuation, for every NIAH variant and
VT, over `tokens_to_generate` tokens (`scripts/data/synthetic/constants.py`: 128 for NIAH, 30 for VT; a continuation
ends early at the end-of-document token, as Hugging Face `generate` stops at EOS in RULER's `pred/model_wrappers.py`).
posenc's stricter score (`scoring="exact"`) decodes only as many tokens as the answer has and asks an exact match of
the stripped output for one answer (containment, case-sensitive, for several).

The prompt and the generated tokens together fill the length under test, as in RULER, whose haystack is sized so
that prompt tokens + `tokens_to_generate` <= `max_seq_length` (`scripts/data/synthetic/niah.py:245,268`).

Sizes (`Sizes`) default to RULER's (`scripts/synthetic.yaml`): niah_multikey_1 4 keys, niah_multivalue 4 values,
niah_multiquery 4 queries (`niah.py:77`: as many keys as queries), vt 1 chain of 4 hops; 7-digit values
(`niah.py:108`), VT a 5-digit value and 5-letter names (`variable_tracking.py:96,110`). Deviations that remain:
needles sit at a requested depth of the first needle (a depth grid; the others uniform) instead of RULER's random
sentence indexes (`niah.py:179`, `variable_tracking.py:154`), and at a haystack unit (token or character), which may
fall inside a filler sentence, not between sentences; RULER's needle and question wording ("One of the special
magic numbers for ... is: ...", its instruction line) is shortened to " The {key} key is {value}." so that an episode
fits a tiny model's window; keys are single words, not RULER's adjective-noun pairs; multiquery joins its keys with
" and " (RULER: "a, b, and c", `niah.py:189`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol

import numpy as np

from posenc_cli.errors import ConfigError

FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEYS = (
    "apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "eagle", "maple", "ocean", "candle", "forest",
    "violet", "rocket", "silver", "garden", "winter", "falcon", "copper", "meadow", "harbor", "pepper", "planet",
    "marble", "canyon", "orchid", "walrus", "basket", "castle", "dragon", "jungle", "kettle", "ladder", "mirror",
    "needle", "pencil", "rabbit", "saddle", "tunnel", "velvet",
)  # fmt: skip
VAR_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
GENERATOR_VERSION = 3  # bump when any task's text or sampling changes (part of the data=tasks fingerprint)
MAX_COUNT = 256  # values per key and hops per chain at most (RULER asks 4)
SCORINGS: tuple[str, ...] = ("contains", "exact")


@dataclass(frozen=True)
class Sizes:
    """How big an episode is; the defaults are RULER's (NVIDIA/RULER c3f5e3b, `scripts/synthetic.yaml`)."""

    keys: int = 4  # niah-multikey: keys in the haystack, the asked one included (niah_multikey_1 num_needle_k)
    values: int = 4  # niah-multivalue: values of the one key (niah_multivalue num_needle_v)
    queries: int = 4  # niah-multiquery: keys asked, all in the haystack (niah_multiquery num_needle_q; niah.py:77)
    hops: int = 4  # variable-tracking: assignments after the value, one chain (vt num_hops, num_chains 1)
    digits: int = 7  # NIAH values (niah.py:108 generate_random_number(num_digits=7))
    vt_digits: int = 5  # the VT value (variable_tracking.py:110 np.random.randint(10000, 99999))
    letters: int = 5  # VT variable names (variable_tracking.py:96 k = 5)
    common: int = 10  # cwe: common words (common_words_extraction.py:63 num_cw)
    common_freq: int = 6  # cwe: repeats of each common word (short config, common_words_extraction.py:106)
    uncommon_freq: int = 1  # cwe: repeats of every other word (common_words_extraction.py:106)
    coded_letters: int = 6  # fwe: letters per coded word (freq_words_extraction.py:61 coded_wordlen)
    hex_digits: int = 8  # kv-retrieval: hex digits per key and value (Liu et al. use UUIDs, 32 hex digits)

    def validate(self, prefix: str = "") -> None:
        """One-line `ConfigError`s naming `prefix + field` for sizes no episode can have."""
        for f in fields(self):
            if not isinstance(getattr(self, f.name), int) or getattr(self, f.name) < 1:
                raise ConfigError(f"{prefix}{f.name} must be an integer >= 1, got {getattr(self, f.name)!r}")
        for name in ("keys", "queries"):
            if getattr(self, name) > len(KEYS):
                raise ConfigError(f"{prefix}{name} must be at most {len(KEYS)} (the key words): {getattr(self, name)}")
        for name in ("values", "hops"):
            if getattr(self, name) > MAX_COUNT:
                raise ConfigError(f"{prefix}{name} must be at most {MAX_COUNT}, got {getattr(self, name)}")
        for name in ("digits", "vt_digits"):
            if getattr(self, name) > 18:
                raise ConfigError(f"{prefix}{name} must be in [1, 18], got {getattr(self, name)}")
        if max(self.keys, self.values, self.queries) > 9 * 10 ** (self.digits - 1):
            raise ConfigError(f"{prefix}digits={self.digits} has too few numbers for distinct values")
        if self.hops + 1 > len(VAR_LETTERS) ** min(self.letters, 8):
            raise ConfigError(f"{prefix}letters={self.letters} has too few names for {self.hops + 1} variables")
        if self.letters > 16:
            raise ConfigError(f"{prefix}letters must be in [1, 16], got {self.letters}")
        if self.common > 64 or max(self.common_freq, self.uncommon_freq) > MAX_COUNT:
            raise ConfigError(f"{prefix}common must be at most 64 and common_freq, uncommon_freq at most {MAX_COUNT}")
        if self.common_freq <= self.uncommon_freq:
            raise ConfigError(
                f"{prefix}common_freq ({self.common_freq}) must exceed uncommon_freq ({self.uncommon_freq}): "
                "else the common words are not the most common"
            )
        if not 3 <= self.coded_letters <= 12:
            raise ConfigError(f"{prefix}coded_letters must be in [3, 12], got {self.coded_letters}")
        if not 4 <= self.hex_digits <= 32:
            raise ConfigError(f"{prefix}hex_digits must be in [4, 32], got {self.hex_digits}")

    def of(self, names: Sequence[str]) -> dict[str, int]:
        """The named sizes as a JSON-safe dict (what one task's cells record and are keyed by)."""
        return {name: int(getattr(self, name)) for name in names}


RULER_SIZES = Sizes()


def string_match_all(output: str, answers: Sequence[str]) -> float:
    """RULER's `string_match_all` for one output (`scripts/eval/synthetic/constants.py:28`): the share of `answers`
    contained in `output`, both lower-cased."""
    text = output.lower()
    return sum(a.lower() in text for a in answers) / len(answers)


def exact_score(output: str, answers: Sequence[str]) -> float:
    """posenc's stricter score of a continuation cut to the answer's tokens: exact match of the stripped output for
    one answer, else the share of answers contained (case-sensitive)."""
    if len(answers) == 1:
        return float(output.strip() == answers[0])
    return sum(a in output for a in answers) / len(answers)


class TokenizerLike(Protocol):
    eod_id: int

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Any) -> str: ...


@dataclass(frozen=True)
class Episode:
    """Needle sentences in episode order with their depths in [0, 1], the question, the expected answers."""

    needles: tuple[str, ...]
    depths: tuple[float, ...]
    question: str
    answers: tuple[str, ...]

    @property
    def answer_text(self) -> str:
        return " " + ", ".join(self.answers)


class RetrievalTask:
    """One registered task: `sample` draws an episode whose first needle sits at `depth`, with the sizes named in
    `size_names`; `tokens_to_generate` is RULER's generation budget for it."""

    name: ClassVar[str]
    summary: ClassVar[str]
    size_names: ClassVar[tuple[str, ...]] = ("digits",)
    tokens_to_generate: ClassVar[int] = 128  # RULER scripts/data/synthetic/constants.py 'niah'
    has_depth: ClassVar[bool] = True  # False: RULER's aggregation tasks, whose cells have no depth (None)

    @classmethod
    def sample(cls, rng: np.random.Generator, depth: float, sizes: Sizes = RULER_SIZES) -> Episode:
        raise NotImplementedError

    @classmethod
    def sample_chars(cls, rng: np.random.Generator, depth: float, chars: int, sizes: Sizes = RULER_SIZES) -> Episode:
        """Training text for a document of about `chars` characters: `sample` for a task of fixed size (the mixture
        pads it with haystack); a task whose context grows with the length (`ContextTask`) fills them."""
        return cls.sample(rng, depth, sizes)

    @classmethod
    def score(cls, output: str, answers: Sequence[str], scoring: str = "contains") -> float:
        """One output's score: RULER's `string_match_all` ("contains") or posenc's `exact_score` ("exact")."""
        return string_match_all(output, answers) if scoring == "contains" else exact_score(output, answers)


# ----------------------------------------------------------------------------------------------------------------
# Sampling helpers.


def random_values(rng: np.random.Generator, n: int, digits: int) -> list[str]:
    """`n` distinct numbers of exactly `digits` digits (no leading zero)."""
    low, high = (10 ** (digits - 1) if digits > 1 else 0), 10**digits
    values: list[str] = []
    while len(values) < n:  # a handful of draws
        v = str(int(rng.integers(low, high)))
        if v not in values:
            values.append(v)
    return values


def random_keys(rng: np.random.Generator, n: int) -> list[str]:
    """`n` distinct key words."""
    return [KEYS[i] for i in rng.choice(len(KEYS), size=n, replace=False)]


def random_names(rng: np.random.Generator, n: int, letters: int) -> list[str]:
    """`n` distinct upper-case variable names."""
    names: list[str] = []
    while len(names) < n:
        name = "".join(VAR_LETTERS[i] for i in rng.integers(0, len(VAR_LETTERS), size=letters))
        if name not in names:
            names.append(name)
    return names


def later_depths(rng: np.random.Generator, depth: float, n: int) -> list[float]:
    """`n` sorted uniform depths in [depth, 1]."""
    return sorted(depth + (1.0 - depth) * float(u) for u in rng.random(n))


# ----------------------------------------------------------------------------------------------------------------
# Rendering: training text (characters) and evaluation prompts (tokens).


def positions(depths: Sequence[float], n_hay: int) -> list[int]:
    """Haystack units before each needle: round(depth · n_hay)."""
    return [round(float(d) * n_hay) for d in depths]


def placement(episode: Episode, n_hay: int) -> list[int]:
    """Needle indexes in the order they appear (by position, ties in episode order)."""
    pos = positions(episode.depths, n_hay)
    return sorted(range(len(pos)), key=lambda i: (pos[i], i))


def fixed_chars(episode: Episode) -> int:
    """Characters of the episode without haystack (needles, question, answer)."""
    return sum(map(len, episode.needles)) + len(episode.question) + len(episode.answer_text)


def haystack_text(haystack: str | None, n: int, rng: np.random.Generator | None = None) -> str:
    """`n` characters of haystack: the filler repeated (None), or a slice of `haystack` at a random offset."""
    text = haystack or FILLER
    if len(text) < n or rng is None:
        return (text * math.ceil(max(n, 1) / len(text)))[:n]
    start = int(rng.integers(0, len(text) - n + 1))
    return text[start : start + n]


def episode_text(episode: Episode, hay: str) -> tuple[str, str]:
    """(prompt, answer) with the needles placed in the haystack `hay` at their depths."""
    pos = positions(episode.depths, len(hay))
    parts, at = [], 0
    for i in placement(episode, len(hay)):
        parts += [hay[at : pos[i]], episode.needles[i]]
        at = pos[i]
    parts += [hay[at:], episode.question]
    return "".join(parts), episode.answer_text


class PromptTooShort(ValueError):
    """The requested length cannot hold the needles, question and answer."""


class BudgetTooShort(PromptTooShort):
    """The generation budget is shorter than the answer, so no output could score 1."""


def until_end(ids: np.ndarray, eod_id: int) -> np.ndarray:
    """The generated ids before the first end-of-document token (generation stops there, as `generate` does at
    EOS in RULER's `scripts/pred/model_wrappers.py`)."""
    stop = np.flatnonzero(ids == eod_id)
    return ids[: stop[0]] if len(stop) else ids


@dataclass
class PromptBatch:
    """Prompts of one length: every row is `length` tokens less the tokens reserved for the continuation (the
    generation budget, or the longest answer of the batch)."""

    prompts: np.ndarray  # (N, P) int64
    answers: np.ndarray  # (N, A) int64, right-padded with -1
    answer_len: np.ndarray  # (N,) int64
    needle_starts: list[list[int]]  # per row: token index of each needle's first token, in episode order
    n_hay: np.ndarray  # (N,) int64: haystack tokens in the prompt


def split_answer(tokenizer: TokenizerLike, text: str) -> tuple[np.ndarray, np.ndarray]:
    """(lead, answer) ids of the answer text: leading whitespace-only tokens belong to the prompt."""
    ids = np.asarray(tokenizer.encode(text), dtype=np.int64)
    k = 0
    while k < len(ids) - 1 and not tokenizer.decode(ids[k : k + 1]).strip():
        k += 1
    return ids[:k], ids[k:]


def build_prompts(
    tokenizer: TokenizerLike,
    episodes: Sequence[Episode],
    length: int,
    haystack: np.ndarray | None = None,
    reserve: int | None = None,
) -> PromptBatch:
    """Token prompts of `length` - `reserve` tokens, `reserve` being the tokens left for the continuation (None:
    the batch's longest answer; RULER reserves `tokens_to_generate`, `niah.py:245`); `haystack`: token ids to draw
    the haystack from (repeated when short; default the encoded filler). Raises `PromptTooShort` when no haystack
    fits.

    Each prompt opens with the end-of-document token, as every training document follows one.
    """
    cycle = np.asarray(tokenizer.encode(FILLER) if haystack is None else haystack, dtype=np.int64)
    parts = []
    for ep in episodes:  # one step per episode
        needles = [np.asarray(tokenizer.encode(n), dtype=np.int64) for n in ep.needles]
        lead, answer = split_answer(tokenizer, ep.answer_text)
        parts.append((needles, np.asarray(tokenizer.encode(ep.question), dtype=np.int64), lead, answer))
    width = max((len(a) for *_, a in parts), default=1)
    kept = width if reserve is None else reserve
    P = length - kept
    n_hay = np.array([P - 1 - sum(map(len, nd)) - len(q) - len(ld) for nd, q, ld, _ in parts], dtype=np.int64)
    if len(parts) and n_hay.min() < 0:
        after = "the answer" if reserve is None else f"{reserve} generated tokens (--tokens-to-generate)"
        raise PromptTooShort(
            f"length {length} is shorter than a prompt without haystack and {after} ({length - n_hay.min()})"
        )
    hay = np.tile(cycle, math.ceil(max(int(n_hay.max(initial=0)), 1) / max(len(cycle), 1)))
    prompts = np.empty((len(parts), P), dtype=np.int64)
    answers = np.full((len(parts), width), -1, dtype=np.int64)
    starts: list[list[int]] = []
    for r, (ep, (needles, question, lead, answer)) in enumerate(zip(episodes, parts, strict=True)):
        n = int(n_hay[r])
        pos = positions(ep.depths, n)
        row, at, length_so_far = [np.array([tokenizer.eod_id], dtype=np.int64)], 0, 1
        start = [0] * len(needles)
        for i in placement(ep, n):
            row.append(hay[at : pos[i]])
            length_so_far += pos[i] - at
            start[i] = length_so_far
            row.append(needles[i])
            length_so_far += len(needles[i])
            at = pos[i]
        row += [hay[at:n], question, lead]
        prompts[r] = np.concatenate(row)
        answers[r, : len(answer)] = answer
        starts.append(start)
    answer_len = np.array([len(a) for *_, a in parts], dtype=np.int64)
    return PromptBatch(prompts, answers, answer_len, starts, n_hay)


# ----------------------------------------------------------------------------------------------------------------
# Tasks whose context is the episode itself (RULER's CWE and FWE, "Lost in the Middle" key-value retrieval).

MAX_UNITS = 1 << 16  # words or pairs of one context at most


@dataclass(frozen=True)
class Draft:
    """The random draws of one context-filling episode: `make(n)` renders it with `n` units (words, pairs), the same
    answers for every `n`; `smallest` is the least `n` the task asks and `what(n)` says what `n` units are."""

    make: Callable[[int], Episode]
    smallest: int
    what: Callable[[int], str]

    def fill(self, fits: Callable[[Episode], bool]) -> Episode:
        """The episode with the most units that `fits` (doubling, then bisection, as RULER's binary search over the
        haystack size, `common_words_extraction.py:146`); `PromptTooShort` when even the smallest does not."""
        if not fits(self.make(self.smallest)):
            raise PromptTooShort(self.what(self.smallest))
        good, bad = self.smallest, None
        while bad is None:  # about log2(units) steps
            n = min(2 * good, MAX_UNITS)
            if n == good:
                return self.make(good)
            good, bad = (n, None) if fits(self.make(n)) else (good, n)
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if fits(self.make(mid)) else (good, mid)
        return self.make(good)


class ContextTask(RetrievalTask):
    """A task whose context grows with the length under test: `draft` draws an episode, `Draft.fill` gives it the
    most units that fit the prompt (`fill_episodes`), and `sample` (training text) renders the draft's smallest
    size. Its one needle is the whole context at depth 1, so a prompt reads <eod> <filler pad> <context>
    <question>: the pad is what is left when one more unit no longer fits (fewer tokens than one unit)."""

    @classmethod
    def draft(
        cls, rng: np.random.Generator, depth: float, sizes: Sizes = RULER_SIZES, room: int | None = None
    ) -> Draft:
        """`room`: the prompt tokens RULER would size the task for (length − generation budget); None: training."""
        raise NotImplementedError

    @classmethod
    def sample(cls, rng: np.random.Generator, depth: float, sizes: Sizes = RULER_SIZES) -> Episode:
        draft = cls.draft(rng, depth, sizes)
        return draft.make(draft.smallest)

    @classmethod
    def sample_chars(cls, rng: np.random.Generator, depth: float, chars: int, sizes: Sizes = RULER_SIZES) -> Episode:
        """Training text of about `chars` characters: the most units whose episode (context, question, answer)
        fits them, the smallest when none does (as the mixture raises a document to what its episode needs)."""
        try:
            draft = cls.draft(rng, depth, sizes, chars)
        except PromptTooShort:  # (FWE: too few characters for RULER's vocabulary of chars // 50 words)
            return cls.sample(rng, depth, sizes)
        try:
            return draft.fill(lambda ep: fixed_chars(ep) <= chars)
        except PromptTooShort:
            return draft.make(draft.smallest)


def context_episode(context: str, question: str, answers: Sequence[str]) -> Episode:
    """The one-needle episode of a context task (the context at depth 1, after the pad)."""
    return Episode((context,), (1.0,), question, tuple(answers))


def fill_episodes(
    tokenizer: TokenizerLike, drafts: Sequence[Draft], length: int, reserve: int | None = None
) -> list[Episode]:
    """Each draft filled to the prompt that `build_prompts(tokenizer, episodes, length, reserve=reserve)` builds:
    <eod>, context, question and the answer's lead in `length` − `reserve` tokens (None: the batch's longest
    answer, which no unit count changes). Raises `PromptTooShort` naming what the smallest episode needs."""
    after = "the answer" if reserve is None else f"{reserve} generated tokens (--tokens-to-generate)"
    if reserve is None:
        reserve = max((len(split_answer(tokenizer, d.make(d.smallest).answer_text)[1]) for d in drafts), default=1)

    def tokens(ep: Episode) -> int:
        lead, _ = split_answer(tokenizer, ep.answer_text)
        return 1 + sum(len(tokenizer.encode(n)) for n in ep.needles) + len(tokenizer.encode(ep.question)) + len(lead)

    episodes = []
    for d in drafts:
        try:
            episodes.append(d.fill(lambda ep: tokens(ep) + reserve <= length))
        except PromptTooShort as e:
            need = tokens(d.make(d.smallest)) + reserve
            raise PromptTooShort(
                f"length {length} is shorter than the smallest prompt ({e}) and {after} ({need})"
            ) from None
    return episodes
