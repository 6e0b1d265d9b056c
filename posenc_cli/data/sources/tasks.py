"""`data=tasks`: a seeded training mixture of RULER-style retrieval episodes (`posenc_cli.data.ruler`) and plain text.

Each episode draws a task by weight, a length uniform in [data.min_len, data.max_len] characters (raised to what
its needles, question and answer need; with `data.max_len_per_task`, redrawn up to the task's own: tasks take
different numbers of tokens per character, and each task's training prompts should reach its 1× prompt) and a
depth uniform in [0, 1]; its haystack is the repeated filler
(`data.haystack=filler`) or a slice of the corpus (`corpus`, the `data.corpus` source with its default settings,
the standard library by default). `data.corpus_share` of the documents are plain corpus text of the same lengths
instead (0: episodes only). Episodes are tokenized by the ordinary token cache, as `data=passkey`'s are, so
`train()` runs unchanged; the fingerprint covers every setting and the corpus's own fingerprint when it is read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from posenc_cli.config import DataConfig, non_negative, positive
from posenc_cli.data.ruler import registry as task_registry
from posenc_cli.data.ruler import task_class
from posenc_cli.data.ruler.base import (
    GENERATOR_VERSION,
    RULER_SIZES,
    ContextTask,
    Sizes,
    episode_text,
    fixed_chars,
    haystack_text,
)
from posenc_cli.data.sources import register, source_class
from posenc_cli.data.sources.base import (
    FORMAT_VERSION,
    DataSource,
    Docs,
    ProgressFn,
    Source,
    memory_table,
    prompt_answer,
    short_hash,
    whole,
)
from posenc_cli.errors import ConfigError

# The default mixture: every registered retrieval task whose training episode fits a short document, sorted. The
# context-filling ones (common-words, frequent-words, kv-retrieval: `ContextTask`) need hundreds of characters, far
# beyond the default data.max_len; name them in data.tasks to train on them.
ALL_TASKS = tuple(name for name, task in task_registry().items() if not issubclass(task, ContextTask))


@dataclass(kw_only=True)
class TasksDataConfig(DataConfig):
    """`data=tasks`: the tasks and their weights (default equal), the share of plain corpus documents, the corpus and
    haystack kind, the number of documents (both splits), their length range in characters (`max_len_per_task`:
    each task's own upper end, one per task of `tasks`, as `weights`), the episode sizes
    (`ruler.base.Sizes`, RULER's by default: 4 keys, values, queries and hops, 7-digit values, VT 5-digit values and
    5-letter names), seed. `posenc eval-tasks` asks a run trained on this mixture episodes of the same sizes, and
    generates `tokens_to_generate` tokens per answer (None: RULER's budget per task, 128 NIAH / 30 VT; an evaluation
    setting, so left out of the training data's fingerprint).

    Its Hydra group node is generated from these defaults (no `configs/data/tasks.yaml`), so a new retrieval task
    file joins the default mixture with no other edit. E.g. `posenc train data=tasks tokenizer=bpe
    tokenizer.vocab_size=512 data.max_len=256 'data.tasks=[niah-single]'`; `data.haystack`: filler (repeated
    sentences) or corpus (slices of real text); `data.corpus_share`: share of plain `data.corpus` documents."""

    source: str = "tasks"
    tasks: list[str] = field(default_factory=lambda: list(ALL_TASKS))
    weights: list[float] | None = None
    corpus_share: float = 0.0
    corpus: str = "stdlib"
    haystack: Literal["filler", "corpus"] = "filler"
    episodes: int = 8000
    min_len: int = 0
    max_len: int = 128
    max_len_per_task: list[int] | None = None
    keys: int = RULER_SIZES.keys
    values: int = RULER_SIZES.values
    queries: int = RULER_SIZES.queries
    hops: int = RULER_SIZES.hops
    digits: int = RULER_SIZES.digits
    vt_digits: int = RULER_SIZES.vt_digits
    letters: int = RULER_SIZES.letters
    tokens_to_generate: int | None = None
    seed: int = 0

    def validate(self) -> None:
        super().validate()
        positive(self, "data", "episodes")
        self.sizes().validate("data.")
        if self.tokens_to_generate is not None and not 1 <= self.tokens_to_generate <= 1 << 20:
            raise ConfigError(f"data.tokens_to_generate must be in [1, 2^20], got {self.tokens_to_generate}")
        non_negative(self, "data", "min_len", "seed")
        if not self.tasks:
            raise ConfigError("data.tasks needs at least one task")
        for name in self.tasks:
            task_class(name)
        if len(set(self.tasks)) != len(self.tasks):
            raise ConfigError(f"data.tasks names a task twice: {self.tasks}")
        if self.weights is not None and (
            len(self.weights) != len(self.tasks) or any(w < 0 for w in self.weights) or sum(self.weights) <= 0
        ):
            raise ConfigError("data.weights: one weight >= 0 per task in data.tasks, not all zero")
        if not 0.0 <= self.corpus_share < 1.0:
            raise ConfigError(f"data.corpus_share must be in [0, 1), got {self.corpus_share}")
        if self.corpus == "tasks":
            raise ConfigError("data.corpus must name another data source (e.g. stdlib)")
        if self.max_len < self.min_len:
            raise ConfigError(f"data.max_len={self.max_len} is below data.min_len={self.min_len}")
        per = self.max_len_per_task
        if per is not None and (len(per) != len(self.tasks) or any(n < self.min_len for n in per)):
            raise ConfigError(
                f"data.max_len_per_task: one length >= data.min_len={self.min_len} per task in data.tasks "
                f"({len(self.tasks)}), got {per}"
            )

    @property
    def longest(self) -> int:
        """The longest episode any task may draw, in characters."""
        return max([self.max_len, *(self.max_len_per_task or [])])

    def sizes(self) -> Sizes:
        """The episode sizes of this mixture (and of eval-tasks on a run trained on it)."""
        return Sizes(self.keys, self.values, self.queries, self.hops, self.digits, self.vt_digits, self.letters)

    @property
    def uses_corpus(self) -> bool:
        return self.corpus_share > 0 or self.haystack == "corpus"

    def corpus_config(self) -> DataConfig:
        """The corpus source's default config (its split follows this config's val_fraction)."""
        cls = source_class(self.corpus).config_cls
        return cls(source=self.corpus, val_fraction=self.val_fraction, cache_dir=self.cache_dir)


def corpus_text(docs: Docs, n_chars: int) -> str:
    """The first documents of a split, joined by newlines, until `n_chars` characters (all when fewer)."""
    out, size = [], 0
    for batch in docs.batches():
        for doc in batch:
            out.append(doc)
            size += len(doc) + 1
            if size >= n_chars:
                return "\n".join(out)
    return "\n".join(out)


def make_documents(data: TasksDataConfig, n: int, seed_part: int, corpus: str | None = None) -> list[str]:
    """`n` documents of the mixture (episodes, their answers scored: `prompt_answer`; and, with corpus_share, corpus
    slices, every token scored); the same arguments give the
    same list. `corpus`: text for corpus haystacks and plain documents (needed when `data.uses_corpus`)."""
    rng = np.random.default_rng([data.seed, GENERATOR_VERSION, seed_part])
    tasks = [task_class(name) for name in data.tasks]
    weights = np.asarray(data.weights if data.weights is not None else [1.0] * len(tasks), dtype=float)
    p = weights / weights.sum()
    sizes = data.sizes()
    docs = []
    for _ in range(n):  # one step per document
        length = int(rng.integers(data.min_len, data.max_len + 1))
        if data.corpus_share > 0 and rng.random() < data.corpus_share:
            docs.append(haystack_text(corpus, max(length, 1), rng))
            continue
        k = int(rng.choice(len(tasks), p=p))
        task = tasks[k]
        if data.max_len_per_task is not None:  # redrawn in the task's range; a mixture without one keeps its stream
            length = int(rng.integers(data.min_len, data.max_len_per_task[k] + 1))
        episode = task.sample_chars(rng, float(rng.random()), length, sizes)  # a ContextTask fills the length
        n_hay = max(length - fixed_chars(episode), 0)
        hay = haystack_text(corpus if data.haystack == "corpus" else None, n_hay, rng)
        prompt, answer = episode_text(episode, hay)
        docs.append(prompt_answer(prompt, answer, task.name))  # prompt + answer, the answer scored; its task told
    return docs


def corpus_info(data: TasksDataConfig, corpus_fingerprint: str | None) -> dict[str, Any]:
    """JSON-safe summary of the mixture; also what its cache fingerprint is made of."""
    info = {"source": "tasks", "generator_version": GENERATOR_VERSION, "task_names": list(task_registry())}
    skip = ("source", "cache_dir", "tokens_to_generate")  # not the documents' settings
    info.update({k: v for k, v in dataclasses.asdict(data).items() if k not in skip})
    if info["max_len_per_task"] is None:  # unset: the fingerprints of mixtures made before the key, unchanged
        del info["max_len_per_task"]
    info["corpus_fingerprint"] = corpus_fingerprint
    return info


@register
class TasksSource(DataSource):
    name = "tasks"
    config_cls = TasksDataConfig
    # a sweep job trained on the mixture measures the tasks it learned (evaluation.tasks.retrieval), then perplexity
    tasks = (*task_registry(), "extrapolate")

    @classmethod
    def open(cls, data: TasksDataConfig, root: Path, progress: ProgressFn | None) -> Source:
        inner = None
        if data.uses_corpus:
            cfg = data.corpus_config()
            inner = source_class(cfg.source).open(cfg, root, progress)
        info = corpus_info(data, inner.fingerprint if inner is not None else None)
        n_val = max(1, round(data.val_fraction * data.episodes)) if data.val_fraction > 0 else 0
        n_val = min(n_val, data.episodes - 1)

        def documents() -> tuple[Docs, Docs, str]:
            train_text = val_text = None
            if inner is not None:
                train_docs, val_docs, _ = inner.documents()
                want = 4 * data.longest * max(data.episodes, 1000)
                train_text = corpus_text(train_docs, min(want, 1 << 24))
                val_text = corpus_text(val_docs, min(want, 1 << 24)) or train_text
            train = make_documents(data, data.episodes - n_val, 0, train_text)
            val = make_documents(data, n_val, 1, val_text)
            return whole(memory_table(train)), whole(memory_table(val)), "generated episodes (seeded)"

        return Source(fingerprint=short_hash("tasks", FORMAT_VERSION, info), info=info, documents=documents)

    @classmethod
    def describe(cls, data: TasksDataConfig) -> str:
        return f"tasks({','.join(data.tasks)})"
