"""What every algorithmic task shares (Kazemnejad et al., NeurIPS 2023, arXiv 2305.19466): examples, solvers, helpers.

An example is a prompt and an answer, laid out as the reference code lays out its decoder-only sequences
(McGill-NLP/length-generalization 40f8a44, `src/data/s2s_dl_factory.py:343`: `prompt = inputs + sep`, then the targets
and the end-of-sequence token): the task's input in the reference's words, the separator (`[SEP]` for copy, reverse
and summation, none for the others: `configs/data/s2s_*.jsonnet`, `decoder_only_input_output_sep_token`), the
answer; in posenc each example is one document, so the end-of-document token closes it. The text is the reference's
with one change of where a space belongs: the reference's prompt ends with a space (`"Copy: a b [SEP] "`) and its
target does not (`"a b"`); here the prompt ends without one and the answer starts with it (`"Copy: a b [SEP]"`,
`" a b"`), so a byte-level BPE cuts `prompt + answer` where it cuts the two pieces one by one (its pre-tokenizer
splits before " word"). The document text is the same.

Each task's `length` is the instance length as the reference defines it (its `cat` field): the number of items
(copy, reverse, sorting, summation, parity), of terms (polynomial), of digits of the longer operand (addition).
`sample(rng, length)` draws one example; `solve(prompt)` reads the input back from the prompt with a regular
expression and computes the answer independently of the generator (the contract test checks that they agree).

Splits as the reference's builders (`scripts/dataset_builders/make_*_dataset.py`, `main`) cut them: training and
validation on lengths `train_min`..L (each builder's own `--train_min` default), test on L+1..2L, every builder bin
holding the same number of examples. A bin is one length for every task but addition, whose bins are pairs of
operand lengths; `sample_in(rng, length, least)` draws as a split whose lengths start at `least` does, and
`length_weight(length, least)` says how many bins of such a split have that length (the weight of the length in
the split's mean accuracy).

Symbols: the reference draws copy/reverse items from 100 and sorting items from 50 single-token words of the T5
vocabulary (`get_unique_tokens`); with posenc's byte tokenizer a word would be several tokens, so the items here are
single characters (`SYMBOLS`: 62 letters and digits; `SORT_SYMBOLS`: their first 50 in ASCII order).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

# bump when any task's text or sampling changes (part of the data and cell fingerprints); 2: addition drawn by
# operand-length bins, summation's '.[SEP]', training from each builder's train_min
GENERATOR_VERSION = 2
SYMBOLS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
SORT_SYMBOLS = "".join(sorted(SYMBOLS))[:50]  # 0-9, A-Z, a-n: sorted means ASCII order
MAX_LENGTH = 1024  # instance lengths at most (a 2L = 2048-item prompt is far beyond any tiny model)


@dataclass(frozen=True)
class Example:
    """One instance: `prompt` (ends without whitespace), `answer` (starts with one space), instance `length`.

    `scored`: None for a task scored on its answer alone; else the document as (text, scored) pieces for a task the
    reference scores at many positions (MQAR's values, flip-flop's reads): their text is `prompt + answer`, the last
    piece is the answer, and `eval-algorithmic` scores every scored piece teacher-forced (`evaluation.teacher_forced`).
    """

    prompt: str
    answer: str
    length: int
    scored: tuple[tuple[str, bool], ...] | None = None

    @property
    def text(self) -> str:
        """The training document: prompt then answer (the token cache appends the end-of-document token)."""
        return self.prompt + self.answer

    @property
    def pieces(self) -> tuple[tuple[str, bool], ...]:
        """The document as (text, scored) pieces (`data.sources.base.Marked`): `scored`, else the prompt unscored
        and the answer scored."""
        return self.scored if self.scored is not None else ((self.prompt, False), (self.answer, True))


class AlgorithmicTask:
    """One registered task: `sample` draws an example of instance length `length` >= `min_length`; `solve` computes
    the answer of a prompt from the prompt alone. `unit` names what `length` counts; `reference` the generator and
    prompt format it follows in McGill-NLP/length-generalization."""

    name: ClassVar[str]
    summary: ClassVar[str]
    unit: ClassVar[str] = "items"
    min_length: ClassVar[int] = 1
    train_min: ClassVar[int]  # the builder's `--train_min` default: training (in distribution) is train_min..L
    reference: ClassVar[str] = ""
    suite: ClassVar[str] = "length-generalization"  # the NoPE paper's tasks; "synthetic": issue #44's
    layout: ClassVar[str] = ""  # tasks sharing a text layout (flip-flop's splits) name it; "": the task's own
    # the cell measure the reference reports, which the competence gate and the accuracy-by-length plot read:
    # "accuracy" (exact match of the answer) or "token_accuracy" (the share of scored pieces right: MQAR, flip-flop)
    reference_metric: ClassVar[str] = "accuracy"

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        raise NotImplementedError

    @classmethod
    def sample_in(cls, rng: np.random.Generator, length: int, least: int) -> Example:
        """An example of length `length` drawn as a split whose lengths start at `least` draws it: `sample` for a
        task whose builder bins by length alone."""
        return cls.sample(rng, length)

    @classmethod
    def length_weight(cls, length: int, least: int) -> int:
        """The number of equally filled builder bins of length `length` in a split whose lengths start at `least`,
        i.e. the length's weight in the split's mean: 1 for a task whose builder bins by length alone."""
        return 1

    @classmethod
    def solve(cls, prompt: str) -> str:
        raise NotImplementedError

    @classmethod
    def is_correct(cls, output: str, example: Example) -> bool:
        """Exact match of a generated continuation (stopped at the end of the document) with the answer."""
        return output == example.answer


def number_to_string(number: int) -> str:
    """Digits separated by spaces, a minus sign as its own word: -120 -> '- 1 2 0' (the reference's
    `number_to_string`, `src/data/data_instance_processor/data_instance_processor.py:726`)."""
    return "- " + number_to_string(-number) if number < 0 else " ".join(str(number))


def string_to_number(text: str) -> int:
    """The inverse of `number_to_string`: '- 1 2 0' -> -120."""
    return int(text.replace(" ", ""))


def random_symbols(rng: np.random.Generator, n: int, alphabet: str = SYMBOLS) -> list[str]:
    """`n` symbols drawn uniformly with replacement (the reference's `np.random.randint(0, len(tokens), n)`)."""
    return [alphabet[i] for i in rng.integers(0, len(alphabet), size=n)]


def random_number(rng: np.random.Generator, digits: int) -> int:
    """A number of exactly `digits` digits, uniform (`make_addition_dataset.py:38-53`: one digit includes 0), drawn
    digit by digit so that any number of digits fits: the leading digit uniform in 1..9, the others in 0..9."""
    if digits == 1:
        return int(rng.integers(0, 10))
    lead = int(rng.integers(1, 10))
    rest = rng.integers(0, 10, size=digits - 1)
    return int(str(lead) + "".join(map(str, rest.tolist())))


def match(pattern: re.Pattern[str], prompt: str, task: str) -> re.Match[str]:
    """`pattern.fullmatch(prompt)`, or a ValueError naming the task (a prompt that is not the task's)."""
    found = pattern.fullmatch(prompt)
    if found is None:
        raise ValueError(f"not a {task} prompt: {prompt!r}")
    return found
