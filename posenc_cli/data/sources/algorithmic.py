"""`data=algorithmic`: seeded examples of the algorithmic tasks of Kazemnejad et al. 2023
(`posenc_cli.data.algorithmic`) of instance lengths <= L, one document each.

Each document draws a task uniformly from `data.tasks` and an instance length from the task's training lengths
[data.min_length (None: the task's builder default `train_min`, 3 for parity, 4 for the others), data.max_length = L]
(`in_distribution_lengths`), each length in proportion to its number of builder bins (`length_weight`: 1 per length,
for addition one per operand-length pair; the reference generates the same number of examples per bin:
McGill-NLP/length-generalization 40f8a44, `scripts/dataset_builders/make_*_dataset.py`, `main`), then one example
of that length as the split draws it (`sample_in`); its text is the prompt and the answer (`Example.text`). The
paper trains on L = 20 (L = 8 with a scratchpad, not built here) and tests on L+1..2L (`posenc eval-algorithmic`,
`posenc_cli.evaluation.algorithmic`, measures 1..2L).

How examples reach the model: the documents are tokenized by the ordinary token cache, each followed by the
end-of-document token, into one stream per split; each is a `Marked` document (`Example.pieces`: the prompt
unscored, the answer, or a task's scored pieces, scored), so the cache also stores which tokens are scored (the answer
and its end-of-document token). By default (`train.packing=stream`, `train.loss_on=all`)
training draws windows of `train.seq_len` tokens at uniform offsets of that stream (`data.cache.window_index`) and
its loss is next-token prediction over every position of the window: prompt tokens, answer tokens and the
end-of-document token alike, and the cut examples at the window's edges. The reference instead trains one example
per sequence starting at position 0 (`configs/data/seq2seq.jsonnet`: `decoder_only_group_samples: false`) with the
loss on the answer tokens only (`decoder_only_mask_inputs: true`): `train.packing=none train.loss_on=answer` does
the same (`posenc_cli.data.rows`; `train.packing=document` packs examples into rows with positions restarting at 0
and a document mask). Under the default, a model also learns to predict the (random) prompts, which costs capacity
but not correctness, and an example can sit anywhere in a window, so a window longer than the longest training
example shows the model positions no training example reaches. Keep `train.seq_len` about the token length of the
longest training example (`configs/sweep/algorithmic.yaml` does) so that test examples beyond L also need positions
beyond those seen in training, as in the paper.

The validation split (`val_fraction` of `examples`) is drawn from its own seeded stream with the same lengths <= L.
`eval_examples` and `eval_max_length` (None: 2L) are what `eval-algorithmic` and a sweep job measure on a run trained
on this source; evaluation settings, so not part of the training data's fingerprint.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from posenc_cli.config import DataConfig, non_negative, positive
from posenc_cli.data.algorithmic import in_distribution_lengths, paper_tasks, task_class
from posenc_cli.data.algorithmic.base import GENERATOR_VERSION, MAX_LENGTH
from posenc_cli.data.sources import register
from posenc_cli.data.sources.base import (
    FORMAT_VERSION,
    DataSource,
    Docs,
    Marked,
    ProgressFn,
    Source,
    memory_table,
    short_hash,
    whole,
)
from posenc_cli.errors import ConfigError

ALL_TASKS = tuple(paper_tasks())  # the NoPE paper's tasks, sorted (the synthetic ones are chosen by name)
PAPER_MAX_LENGTH = 20  # L of the paper's main experiments (Kazemnejad et al. 2023, section 4)
EVAL_SETTINGS = ("eval_examples", "eval_max_length")  # read by eval-algorithmic, not part of the documents


@dataclass(kw_only=True)
class AlgorithmicDataConfig(DataConfig):
    """`data=algorithmic`: the tasks (default all), the number of examples (both splits), the instance-length range
    [min_length (None: each task's builder default), max_length = L] of training, the generator's seed; and, for
    `posenc eval-algorithmic` on a run trained on it, examples per task × length and the longest test length (None: 2L).

    Its Hydra group node is generated from these defaults (no `configs/data/algorithmic.yaml`), so a new task file
    joins the default mixture with no other edit. E.g. `posenc train data=algorithmic 'data.tasks=[copy,reverse]'
    data.max_length=20`."""

    source: str = "algorithmic"
    tasks: list[str] = field(default_factory=lambda: list(ALL_TASKS))
    examples: int = 100_000  # the paper's 100K training examples (per task there; see the module docstring)
    min_length: int | None = None  # None: each task's `train_min` (the reference builders' default)
    max_length: int = PAPER_MAX_LENGTH
    seed: int = 0
    eval_examples: int = 100
    eval_max_length: int | None = None

    def validate(self) -> None:
        super().validate()
        positive(self, "data", "examples", "max_length", "eval_examples")
        if self.min_length is not None:
            positive(self, "data", "min_length")
        non_negative(self, "data", "seed")
        if not self.tasks:
            raise ConfigError("data.tasks needs at least one task")
        for name in self.tasks:
            task_class(name, "task in data.tasks")
        if len(set(self.tasks)) != len(self.tasks):
            raise ConfigError(f"data.tasks names a task twice: {self.tasks}")
        if self.min_length is not None and self.max_length < self.min_length:
            raise ConfigError(f"data.max_length={self.max_length} is below data.min_length={self.min_length}")
        if self.max_length > MAX_LENGTH:
            raise ConfigError(f"data.max_length must be at most {MAX_LENGTH}, got {self.max_length}")
        if self.eval_max_length is not None and not 1 <= self.eval_max_length <= 2 * MAX_LENGTH:
            raise ConfigError(f"data.eval_max_length must be in [1, {2 * MAX_LENGTH}], got {self.eval_max_length}")

    @property
    def test_max_length(self) -> int:
        """The longest instance length evaluated: `eval_max_length`, else 2L."""
        return self.eval_max_length if self.eval_max_length is not None else 2 * self.max_length


def length_range(data: AlgorithmicDataConfig, name: str) -> tuple[int, int]:
    """[low, high] instance lengths of training examples of task `name` (`in_distribution_lengths`)."""
    return in_distribution_lengths(name, data.max_length, data.min_length)


def cumulative_weights(name: str, low: int, high: int) -> np.ndarray:
    """The running sum of the weights of lengths low..high in training (`length_weight`: each length's number of
    builder bins), integers so that a draw below the total picks a length exactly."""
    return np.cumsum([task_class(name).length_weight(k, low) for k in range(low, high + 1)])


def draw_length(rng: np.random.Generator, low: int, cumulative: np.ndarray) -> int:
    """A length low.. with the chances `cumulative` gives: the first whose running weight exceeds a uniform draw."""
    return low + int(np.searchsorted(cumulative, rng.integers(0, cumulative[-1]), side="right"))


def make_documents(data: AlgorithmicDataConfig, n: int, seed_part: int) -> list[str]:
    """`n` examples of the mixture, each its pieces (`Example.pieces`: the prompt unscored, the answer scored); the
    same arguments give the same list (`seed_part` 0: train, 1: val)."""
    rng = np.random.default_rng([data.seed, GENERATOR_VERSION, seed_part])
    tasks = [task_class(name) for name in data.tasks]
    ranges = [length_range(data, name) for name in data.tasks]
    weights = [cumulative_weights(name, *span) for name, span in zip(data.tasks, ranges, strict=True)]
    docs = []
    for _ in range(n):  # one step per document
        i = int(rng.integers(0, len(tasks)))
        low = ranges[i][0]
        example = tasks[i].sample_in(rng, draw_length(rng, low, weights[i]), low)
        docs.append(Marked(*example.pieces))  # the text is `example.text`; the answer (or every scored piece) scored
    return docs


def corpus_info(data: AlgorithmicDataConfig) -> dict[str, Any]:
    """JSON-safe summary of the examples; also what their cache fingerprint is made of."""
    info: dict[str, Any] = {"source": "algorithmic", "generator_version": GENERATOR_VERSION}
    skip = ("source", "cache_dir", *EVAL_SETTINGS)  # not the documents' settings
    info.update({k: v for k, v in dataclasses.asdict(data).items() if k not in skip})
    return info


def split_sizes(data: AlgorithmicDataConfig) -> tuple[int, int]:
    """(train, val) documents: round(val_fraction · examples) to validation, at least one when val_fraction > 0."""
    n_val = max(1, round(data.val_fraction * data.examples)) if data.val_fraction > 0 else 0
    n_val = min(n_val, data.examples - 1)
    return data.examples - n_val, n_val


@register
class AlgorithmicSource(DataSource):
    name = "algorithmic"
    config_cls = AlgorithmicDataConfig
    # a sweep job trained on the examples measures exact match per task × length, then perplexity
    tasks = ("algorithmic", "extrapolate")

    @classmethod
    def open(cls, data: AlgorithmicDataConfig, root: Path, progress: ProgressFn | None) -> Source:
        info = corpus_info(data)

        def documents() -> tuple[Docs, Docs, str]:
            n_train, n_val = split_sizes(data)
            train, val = make_documents(data, n_train, 0), make_documents(data, n_val, 1)
            return whole(memory_table(train)), whole(memory_table(val)), "generated examples (seeded)"

        return Source(fingerprint=short_hash("algorithmic", FORMAT_VERSION, info), info=info, documents=documents)

    @classmethod
    def describe(cls, data: AlgorithmicDataConfig) -> str:
        return f"algorithmic({','.join(data.tasks)}; L={data.max_length})"
