"""The examples of a token stream and the prompt of each: pure numpy, shared by the token cache (which records the
longest prompt of each task of a mixture) and the training rows (`data.rows`).

A stream is documents each followed by an end-of-document token ([eod]); an example is the tokens from one [eod] to
the next, read in a row as n inputs ([eod] + the document) and n targets (the document + [eod]). Its prompt is what
the row reads before it predicts its first scored token: the inputs up to and including the one that predicts it,
[eod] included, so a prompt of p tokens is what an evaluation cell whose prompt is p tokens long asks for (issue #38:
a task's 1× prompt longer than every training prompt is a length the run never saw).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["NO_PROMPT", "Examples", "example_prompts", "find_examples", "longest_spans"]

NO_PROMPT = -1  # the prompt of an example with no scored token


@dataclass(frozen=True)
class Examples:
    """The examples of a split: `starts` (D,) offset of each document's first token, `ends` (D,) of its
    end-of-document token (int64); `lengths` = ends - starts + 1, the inputs (and targets) of each in a row."""

    starts: np.ndarray
    ends: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return self.ends - self.starts + 1


def find_examples(tokens: np.ndarray, eod_id: int) -> Examples:
    """Every document of a split: the spans between its end-of-document tokens (tokens after the last one: none)."""
    ends = np.flatnonzero(np.asarray(tokens) == eod_id).astype(np.int64)  # (D,)
    starts = np.concatenate([np.zeros(1, dtype=np.int64), ends[:-1] + 1])[: ends.size]  # (D,)
    return Examples(starts, ends)


def example_prompts(examples: Examples, scored: np.ndarray) -> np.ndarray:
    """(D,) int64 the prompt of each example, in tokens: its inputs up to the one that predicts its first scored
    target ([eod] + the document tokens before it), `NO_PROMPT` where none of its targets is scored. `scored`: one
    mark per token of the stream (its document tokens and its [eod])."""
    marked = np.flatnonzero(np.asarray(scored))  # (S,) offsets of the scored tokens
    prompts = np.full(examples.ends.size, NO_PROMPT, dtype=np.int64)  # (D,)
    if marked.size == 0 or examples.ends.size == 0:
        return prompts
    at = np.searchsorted(marked, examples.starts)  # (D,) the first scored offset at or after each start
    first = marked[np.minimum(at, marked.size - 1)]  # (D,)
    has = (at < marked.size) & (first <= examples.ends)  # (D,) the example holds a scored token
    prompts[has] = first[has] - examples.starts[has] + 1  # the document tokens before it, and the opening [eod]
    return prompts


def longest_spans(examples: Examples, scored: np.ndarray | None) -> tuple[int, int | None]:
    """(the longest example's row length n: [eod] + its document, its split's longest prompt, `example_prompts`;
    None without a scored mask or a scored token; (0, None) without an example). What a task's 1× prompt must not
    exceed to be in distribution (issue #38)."""
    if examples.ends.size == 0:
        return 0, None
    longest = int(examples.lengths.max())
    if scored is None:
        return longest, None
    prompts = example_prompts(examples, scored)  # (D,)
    return longest, int(prompts.max()) if (prompts != NO_PROMPT).any() else None
