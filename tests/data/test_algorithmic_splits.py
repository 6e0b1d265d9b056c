"""The algorithmic splits as the reference's builders cut them (McGill-NLP/length-generalization 40f8a44,
`scripts/dataset_builders/make_*_dataset.py`): addition's operand-length bins equally filled in training and in the
test split (checked by a chi-square test on 100,000 draws against the bins built here from the builder's rule), the
test split's weight of length k (2k − 1 from one digit on, 2(k − 4) + 1 from the builder's default of four), training
from each builder's own `--train_min`, and summation's text byte for byte."""

from __future__ import annotations

import itertools
import re
from collections import Counter

import numpy as np
import pytest

from posenc_cli.data.algorithmic import in_distribution_lengths, registry, task_class
from posenc_cli.data.algorithmic.addition import operand_digits
from posenc_cli.data.sources.algorithmic import AlgorithmicDataConfig, length_range, make_documents
from posenc_cli.evaluation.algorithmic import split_mean, summarize

BUILDER_TRAIN_MIN = {  # the NoPE paper's tasks: each builder's `--train_min` default (make_<task>_dataset.py)
    "addition": 4,
    "copy": 4,
    "parity": 3,
    "polynomial": 4,
    "reverse": 4,
    "sorting": 4,
    "summation": 4,
}
ADDITION = re.compile(r"Compute ([\d ]+) \+ ([\d ]+) \? ")
# the 0.999 quantiles of chi-square with 24 and 143 degrees of freedom (scipy.stats.chi2.ppf)
CHI2_999 = {24: 51.18, 143: 201.0}


def builder_train_bins(train_min: int, train_max: int) -> set[tuple[int, int]]:
    """The training bins of `make_addition_dataset.py:86-90`: every pair of operand lengths in train_min..train_max."""
    return set(itertools.product(range(train_min, train_max + 1), repeat=2))


def builder_test_bins(train_min: int, train_max: int) -> set[tuple[int, int]]:
    """The test bins of `make_addition_dataset.py:106-120`: one operand in L+1..2L, the other in train_min..2L."""
    beyond, every = range(train_max + 1, 2 * train_max + 1), range(train_min, 2 * train_max + 1)
    return set(itertools.product(beyond, every)) | set(itertools.product(every, beyond))


def chi_square(counts: Counter, bins: set[tuple[int, int]]) -> float:
    """Pearson's statistic of `counts` against the same count in every bin of `bins`."""
    expected = sum(counts.values()) / len(bins)
    return sum((counts.get(b, 0) - expected) ** 2 / expected for b in bins)


def test_training_bins_are_the_builders_equally_filled() -> None:
    docs = make_documents(AlgorithmicDataConfig(tasks=["addition"], max_length=8), 100_000, 0)
    counts = Counter()
    for doc in docs:
        a, b = ADDITION.match(doc).groups()  # type: ignore[union-attr]
        counts[len(a.split()), len(b.split())] += 1
    bins = builder_train_bins(4, 8)
    assert set(counts) == bins  # no (1, 1)..(3, 8): the builder trains from four digits
    assert chi_square(counts, bins) < CHI2_999[len(bins) - 1]


def test_test_split_bins_are_the_builders_equally_filled() -> None:
    """Lengths 9..16 drawn in proportion to `length_weight` (as the evaluation's means weigh them), then a bin."""
    task, rng = task_class("addition"), np.random.default_rng(0)
    lengths = np.arange(9, 17)
    weights = np.array([task.length_weight(int(k), 4) for k in lengths])
    counts = Counter(
        operand_digits(rng, int(k), 4) for k in rng.choice(lengths, size=100_000, p=weights / weights.sum())
    )
    bins = builder_test_bins(4, 8)
    assert set(counts) == bins
    assert chi_square(counts, bins) < CHI2_999[len(bins) - 1]


def test_the_test_split_weighs_length_k_by_its_bins() -> None:
    task = task_class("addition")
    for train_min in (1, 4):
        bins = builder_test_bins(train_min, 20)
        for k in range(21, 41):
            assert task.length_weight(k, train_min) == sum(max(b) == k for b in bins)
    assert [task.length_weight(k, 1) for k in range(1, 41)] == [2 * k - 1 for k in range(1, 41)]
    others = [t for t in BUILDER_TRAIN_MIN if t != "addition"]  # the builders that bin by length alone
    assert all(task_class(t).length_weight(k, 4) == 1 for t in others for k in range(4, 41))


def _entries(task: str, accuracy: dict[int, float], train_min: int, limit: int) -> list[dict]:
    return [
        {"task": task, "length": n, "accuracy": a, "status": "ok", "train_max_length": limit,
         "train_min_length": train_min}
        for n, a in accuracy.items()
    ]  # fmt: skip


def test_the_beyond_mean_weighs_addition_2k_minus_1_and_other_tasks_equally() -> None:
    accuracy = {1: 1.0, 2: 1.0, 3: 1.0, 4: 0.0}  # L = 2: lengths 3 and 4 are beyond
    add, copy = summarize(_entries("addition", accuracy, 1, 2) + _entries("copy", accuracy, 1, 2))
    assert add.beyond == pytest.approx((5 * 1.0 + 7 * 0.0) / (5 + 7))  # weights 2k - 1 = 5, 7
    assert copy.beyond == pytest.approx(0.5)
    assert split_mean("addition", accuracy, 3, 4, 1) == add.beyond


def test_in_distribution_is_train_min_to_L() -> None:
    accuracy = {n: (0.0 if n < 4 else 1.0) for n in range(1, 11)}  # nothing right below the builder's four
    (copy,) = summarize(_entries("copy", accuracy, 4, 5))
    assert copy.in_distribution == 1.0 and copy.min_length == 4


@pytest.mark.parametrize("name", sorted(BUILDER_TRAIN_MIN))
def test_training_lengths_start_at_the_builders_minimum(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert name in registry() and task_class(name).train_min == BUILDER_TRAIN_MIN[name]
    assert in_distribution_lengths(name, 20) == (BUILDER_TRAIN_MIN[name], 20)
    assert in_distribution_lengths(name, 20, 1) == (1, 20)  # data.min_length overrides
    assert in_distribution_lengths(name, 2) == (2, 2)  # an L below train_min trains on L alone
    drawn: list[int] = []
    cls = task_class(name)
    original = cls.sample_in.__func__  # type: ignore[attr-defined]

    def record(c: type, rng: np.random.Generator, length: int, least: int) -> object:
        drawn.append(length)
        assert least == BUILDER_TRAIN_MIN[name]
        return original(c, rng, length, least)

    monkeypatch.setattr(cls, "sample_in", classmethod(record))
    data = AlgorithmicDataConfig(tasks=[name], max_length=8)
    make_documents(data, 400, 0)
    assert set(drawn) == set(range(BUILDER_TRAIN_MIN[name], 9)) and length_range(data, name)[0] == min(drawn)


def test_summation_text_is_the_references_byte_for_byte() -> None:
    """The reference's document: `_create_prompt` + the separator `[SEP] ` + `_create_targets`
    (`sum_instance_processor.py:129,137`, `configs/data/s2s_sum.jsonnet`, `s2s_dl_factory.py:343`)."""
    task, rng = task_class("summation"), np.random.default_rng(0)
    for n in (1, 4, 9, 23):
        e = task.sample(rng, n)
        values = [int(v) for v in re.findall(r"\d", e.prompt)]
        assert len(values) == n
        source = "Compute: " + " + ".join(str(v) for v in values) + " ."
        reference = source + "[SEP] " + f"The answer is {sum(values) % 10} ."
        assert e.text.encode() == reference.encode()
    assert task.solve("Compute: 4 + 9 + 1 .[SEP]") == " The answer is 4 ."
    assert task.sample(np.random.default_rng(1), 3).text.count(" .[SEP] The answer is ") == 1
