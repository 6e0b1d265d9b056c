"""RULER's effective length (Hsieh et al., COLM 2024; NVIDIA/RULER c3f5e3b README.md:54): the longest length up to
which a model's score stays above a threshold, RULER's being Llama-2-7B's score at 4K, 85.6%.

posenc applies it per run × task (RULER: per model, on the mean over its tasks) to the mean score over a length's
depths, and counts a score equal to the threshold as passing (RULER says "exceeding"). A length that could not be
measured (n/a: beyond the scheme, too short for the prompt) neither passes nor fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

RULER_THRESHOLD = 0.856  # Llama-2-7B's RULER score at 4K (README.md:54, table row "Llama2 (7B) 4K 85.6")


@dataclass(frozen=True)
class EffectiveLength:
    """RULER's effective length of one run × task: `length` the longest measured length up to which every measured
    score stays >= `threshold` (None: even the shortest fails, or nothing was measured); `open_ended`: the longest
    measured length still passes, so the effective length is at least `length`."""

    length: int | None
    open_ended: bool
    measured: int  # lengths with a score
    threshold: float

    @property
    def label(self) -> str:
        if not self.measured:
            return "n/a"
        if self.length is None:
            return "none"
        return f"≥ {self.length}" if self.open_ended else str(self.length)


def effective_length(scores: Sequence[tuple[int, float | None]], threshold: float = RULER_THRESHOLD) -> EffectiveLength:
    """RULER's effective length (NVIDIA/RULER README.md:54: the longest length whose score exceeds the threshold) from
    (length, score) pairs, score None where the length is n/a (not measurable: skipped, neither passing nor failing).
    Scores "stay" above the threshold: a failing length ends the search even if a longer one passes again."""
    measured = sorted((n, s) for n, s in scores if s is not None)
    best = None
    for n, score in measured:
        if score < threshold:
            return EffectiveLength(best, False, len(measured), threshold)
        best = n
    return EffectiveLength(best, best is not None, len(measured), threshold)
