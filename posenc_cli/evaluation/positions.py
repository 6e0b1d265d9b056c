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

__all__ = [
    "MODES",
    "BeyondRange",
    "Positions",
    "PositionsMode",
    "draw_layers",
    "resolve_positions",
    "trained_positions",
]


class BeyondRange(ValueError):
    """More ids than a randomized-position range holds (`Positions.beyond_range` says why): the cell is n/a."""


@dataclass(frozen=True)
class Positions:
    """Position ids of an evaluation: `mode` "sequential" (0..T−1) or "random" (sorted draws from [0, `range`),
    seeded by `seed`; `layers` > 0: one draw per layer, (B, layers, T), as a run trained with
    `train.random_positions_draw=layer` was fed)."""

    mode: PositionsMode = "sequential"
    range: int | None = None
    seed: int | None = None
    layers: int = 0

    @property
    def random(self) -> bool:
        return self.mode == "random"

    def to_json(self) -> dict[str, Any]:
        """What an entry records (`results.positions_key` reads it)."""
        if not self.random:
            return {"mode": "sequential"}
        doc: dict[str, Any] = {"mode": "random", "range": self.range, "seed": self.seed}
        return doc | ({"layers": self.layers} if self.layers else {})  # one draw for all layers: as before

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
        """(batch, length) int64 ids: per row a sorted draw without replacement from [0, M); (batch, layers,
        length) with `layers`: per row and layer."""
        assert self.range is not None
        return random_position_ids(batch, length, self.range, generator, self.layers)  # (B, T) or (B, layers, T)


def resolve_positions(
    requested: str | None, random_range: int, seed: int = 0, *, run: str = "the run", layers: int = 0
) -> Positions:
    """The positions to feed a run trained with `train.random_positions=random_range` (0: off), drawn per layer
    when `layers` > 0 (`draw_layers`).

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
    return Positions("random", int(random_range), int(seed), int(layers))


def draw_layers(config: Any) -> int:
    """How many per-layer draws a run's random positions take: its n_layer when it was trained with
    `train.random_positions_draw=layer`, else 0 (one draw every layer shares)."""
    train, model = getattr(config, "train", None), getattr(config, "model", None)
    per_layer = getattr(train, "random_positions_draw", "sequence") == "layer"
    return int(getattr(model, "n_layer", 0)) if per_layer and getattr(train, "random_positions", 0) else 0


def trained_positions(config: Any) -> Positions:
    """The positions a run was trained on, for the decoding evaluations (eval-passkey, eval-tasks, eval-algorithmic):
    sorted draws from [0, M) (seed 0) for a run trained with `train.random_positions=M`, as the authors evaluate,
    else 0..T−1."""
    train = getattr(config, "train", None)
    return resolve_positions(None, int(getattr(train, "random_positions", 0) or 0), layers=draw_layers(config))
