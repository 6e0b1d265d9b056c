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

Scoring follows RULER: the share of expected answers present in the greedy output (`string_match_all`); a task with
one answer is scored by exact match of the stripped output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEYS = (
    "apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "eagle", "maple", "ocean", "candle", "forest",
    "violet", "rocket", "silver", "garden", "winter", "falcon", "copper", "meadow", "harbor", "pepper", "planet",
    "marble", "canyon", "orchid", "walrus", "basket", "castle", "dragon", "jungle", "kettle", "ladder", "mirror",
    "needle", "pencil", "rabbit", "saddle", "tunnel", "velvet",
)  # fmt: skip
VAR_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
DEFAULT_DIGITS = 4
GENERATOR_VERSION = 2  # bump when any task's text or sampling changes (part of the data=tasks fingerprint)


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
    """One registered task: `sample` draws an episode whose first needle sits at `depth`."""

    name: ClassVar[str]
    summary: ClassVar[str]

    @classmethod
    def sample(cls, rng: np.random.Generator, depth: float, digits: int = DEFAULT_DIGITS) -> Episode:
        raise NotImplementedError

    @classmethod
    def score(cls, output: str, answers: Sequence[str]) -> float:
        """RULER's score of one output: exact match for one answer, else the share of answers present in it."""
        if len(answers) == 1:
            return float(output.strip() == answers[0])
        return sum(a in output for a in answers) / len(answers)


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


def random_names(rng: np.random.Generator, n: int, letters: int = 3) -> list[str]:
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


@dataclass
class PromptBatch:
    """Prompts of one length: every row is `length` tokens with the longest answer of the batch appended."""

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
    tokenizer: TokenizerLike, episodes: Sequence[Episode], length: int, haystack: np.ndarray | None = None
) -> PromptBatch:
    """Token prompts of `length` tokens including the batch's longest answer; `haystack`: token ids to draw the
    haystack from (repeated when short; default the encoded filler). Raises `PromptTooShort` when no haystack fits.

    Each prompt opens with the end-of-document token, as every training document follows one.
    """
    cycle = np.asarray(tokenizer.encode(FILLER) if haystack is None else haystack, dtype=np.int64)
    parts = []
    for ep in episodes:  # one step per episode
        needles = [np.asarray(tokenizer.encode(n), dtype=np.int64) for n in ep.needles]
        lead, answer = split_answer(tokenizer, ep.answer_text)
        parts.append((needles, np.asarray(tokenizer.encode(ep.question), dtype=np.int64), lead, answer))
    width = max((len(a) for *_, a in parts), default=1)
    P = length - width
    n_hay = np.array([P - 1 - sum(map(len, nd)) - len(q) - len(ld) for nd, q, ld, _ in parts], dtype=np.int64)
    if len(parts) and n_hay.min() < 0:
        raise PromptTooShort(f"length {length} is shorter than a prompt without haystack ({length - n_hay.min()})")
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
