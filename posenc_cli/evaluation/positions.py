"""The position ids an evaluation feeds: 0..T−1, or the randomized positions a run was trained with.

A run trained with `train.random_positions=M` (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
Generalization of Transformers") saw, for every sequence, a sorted random subset of [0, M) as its position ids. The
authors draw such ids in every application of the encoding, at test time too: google-deepmind/
randomized_positional_encodings, `models/positional_encodings.py` lines 217-224 (a sorted
`choice(arange(M), seq_len, replace=False)`), and the maintainers in that repository's issue #1 ("Yes, we also
randomize at test time"). So `eval-extrapolate` of such a run draws, by default, one sorted subset of [0, M) of
size T per window ("random"); "sequential" (0..T−1, what every other run is fed) stays available as an explicit
choice. A length T > M has no such subset: it is n/a (`beyond_range`).

The draws are seeded and deterministic: every window of length T takes its ids, in window order, from one
generator seeded by (seed, T), so the same seed scores the same ids whatever the batch size, and a cell records
its mode, range and seed (`Positions.to_json`, part of the cell key: `results.positions_key`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

import torch

from posenc_cli.errors import ConfigError
from posenc_cli.positional.ids import random_position_ids

PositionsMode = Literal["random", "sequential"]
MODES = ("random", "sequential")

__all__ = ["MODES", "BeyondRange", "Positions", "PositionsMode", "resolve_positions", "trained_positions"]


class BeyondRange(ValueError):
    """More ids than a randomized-position range holds (`Positions.beyond_range` says why): the cell is n/a."""


@dataclass(frozen=True)
class Positions:
    """Position ids of an evaluation: `mode` "sequential" (0..T−1) or "random" (sorted draws from [0, `range`),
    seeded by `seed`)."""

    mode: PositionsMode = "sequential"
    range: int | None = None
    seed: int | None = None

    @property
    def random(self) -> bool:
        return self.mode == "random"

    def to_json(self) -> dict[str, Any]:
        """What an entry records (`results.positions_key` reads it)."""
        if not self.random:
            return {"mode": "sequential"}
        return {"mode": "random", "range": self.range, "seed": self.seed}

    def beyond_range(self, length: int) -> str | None:
        """Why `length` ids cannot be drawn (None when they can): T distinct ids need T <= M."""
        if self.random and self.range is not None and length > self.range:
            return (
                f"randomized positions (train.random_positions={self.range}) draw {length} distinct ids "
                f"from [0, {self.range}): at most {self.range} tokens"
            )
        return None

    def generator(self, length: int) -> torch.Generator:
        """The generator of every window of `length`, in window order: seeded by (seed, length)."""
        digest = hashlib.sha256(f"posenc-eval-positions:{self.seed}:{length}".encode()).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)

    def draw(self, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """(batch, length) int64 ids: per row a sorted draw without replacement from [0, M)."""
        assert self.range is not None
        return random_position_ids(batch, length, self.range, generator)  # (B, T)


def resolve_positions(requested: str | None, random_range: int, seed: int = 0, *, run: str = "the run") -> Positions:
    """The positions to feed a run trained with `train.random_positions=random_range` (0: off).

    `requested` None is the run's own: random for a run trained with randomized positions, else sequential.
    "random" on a run without them is a `ConfigError` (there is no range to draw from).
    """
    if requested is not None and requested not in MODES:
        raise ConfigError(f"--positions must be random or sequential, got {requested!r}")
    mode = requested or ("random" if random_range else "sequential")
    if mode == "sequential":
        return Positions()
    if not random_range:
        raise ConfigError(
            f"--positions random: {run} was not trained with randomized positions (train.random_positions is 0)"
        )
    return Positions("random", int(random_range), int(seed))


def trained_positions(config: Any) -> Positions:
    """The positions a run was trained on, for the decoding evaluations (eval-passkey, eval-tasks, eval-algorithmic):
    sorted draws from [0, M) (seed 0) for a run trained with `train.random_positions=M`, as the authors evaluate,
    else 0..T−1."""
    train = getattr(config, "train", None)
    return resolve_positions(None, int(getattr(train, "random_positions", 0) or 0))
