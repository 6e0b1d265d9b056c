"""The contract every registered algorithmic task keeps (parametrised over the registry, so a new task file is tested
the moment it exists): its independent solver reads every generated prompt and gives the generator's answer (100%
over many seeds and lengths, 1..2L and beyond, from the task's least length), the generator is seeded, the layout
keeps the prompt/answer cut (and every scored piece's) where a byte-level BPE cuts, answers vary, and a solver
refuses another task's prompt (tasks sharing a layout, flip-flop's splits, share a solver)."""

from __future__ import annotations

import numpy as np
import pytest

from posenc_cli.data.algorithmic import registry, task_class
from posenc_cli.data.algorithmic.base import AlgorithmicTask
from posenc_cli.data.tokenizer import ByteTokenizer, train_bpe
from posenc_cli.errors import ConfigError
from posenc_cli.evaluation.algorithmic import encode_example
from posenc_cli.evaluation.teacher_forced import piece_spans

LENGTHS = [*range(1, 41), 57, 80]  # 1..2L for the paper's L = 20, and past it


@pytest.fixture(params=sorted(registry()))
def task(request: pytest.FixtureRequest) -> type[AlgorithmicTask]:
    return registry()[request.param]


def test_the_solver_reads_every_prompt_and_gives_the_generated_answer(task: type[AlgorithmicTask]) -> None:
    solved = total = 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        for n in (n for n in LENGTHS if n >= task.min_length):
            example = task.sample(rng, n)
            assert example.length == n
            solved += task.solve(example.prompt) == example.answer
            total += 1
    assert solved == total  # 100%


def test_generation_is_seeded(task: type[AlgorithmicTask]) -> None:
    lengths = (task.min_length, 5, 20)
    first = [task.sample(np.random.default_rng(7), n) for n in lengths]
    again = [task.sample(np.random.default_rng(7), n) for n in lengths]
    other = [task.sample(np.random.default_rng(8), n) for n in lengths]
    assert first == again and first != other


def test_layout_prompt_then_answer(task: type[AlgorithmicTask]) -> None:
    rng = np.random.default_rng(0)
    for n in (task.min_length, 3, 20):
        e = task.sample(rng, n)
        assert e.prompt == e.prompt.strip() and e.answer.startswith(" ") and not e.answer.startswith("  ")
        assert e.answer == e.answer.rstrip() and "\n" not in e.text and e.text == e.prompt + e.answer
        prompt, answer = encode_example(ByteTokenizer(), e)
        assert prompt[0] == ByteTokenizer.eod_id and answer[-1] == ByteTokenizer.eod_id
        assert len(prompt) + len(answer) == len(e.text.encode()) + 2
        assert "".join(text for text, _ in e.pieces) == e.text and e.pieces[-1] == (e.answer, True)


def test_bpe_cuts_between_prompt_and_answer(task: type[AlgorithmicTask]) -> None:
    rng = np.random.default_rng(1)
    docs = [task.sample(rng, int(n)).text for n in rng.integers(task.min_length, 21, size=300)]
    bpe = train_bpe(iter(docs), 320)
    for n in (task.min_length, 7, 20, 40):
        example = task.sample(rng, n)
        encode_example(bpe, example)  # raises when the cut moves
        piece_spans(bpe, example)  # so for every scored piece


def test_answers_vary(task: type[AlgorithmicTask]) -> None:
    rng = np.random.default_rng(2)
    assert len({task.sample(rng, 6).answer for _ in range(60)}) >= 2


def test_a_solver_refuses_another_tasks_prompt(task: type[AlgorithmicTask]) -> None:
    rng = np.random.default_rng(3)
    for other in registry().values():
        if other is not task and (other.layout or other.name) != (task.layout or task.name):
            with pytest.raises(ValueError, match=f"not a {task.layout or task.name} prompt"):
                task.solve(other.sample(rng, 4).prompt)


def test_task_metadata(task: type[AlgorithmicTask]) -> None:
    assert task.summary and task.reference and task.min_length >= 1
    if task.suite == "length-generalization":  # the NoPE paper's builders; the others cite their own repository
        assert task.reference.startswith("scripts/dataset_builders/")
    assert task.train_min >= task.min_length  # every task states its builder's --train_min default
    assert task_class(task.name) is task


def test_unknown_task_names_the_closest() -> None:
    with pytest.raises(ConfigError, match="did you mean 'reverse'"):
        task_class("revrse")


def test_default_mixture_is_the_nope_papers_tasks() -> None:
    """data=algorithmic and eval-algorithmic default to the NoPE paper's tasks; synthetic ones are chosen by name."""
    from posenc_cli.data.algorithmic import paper_tasks, registry
    from posenc_cli.data.sources.algorithmic import AlgorithmicDataConfig

    synthetic = {name for name, cls in registry().items() if cls.suite == "synthetic"}
    assert synthetic, "the synthetic tasks are registered"
    assert AlgorithmicDataConfig().tasks == paper_tasks()
    assert not synthetic & set(paper_tasks())
    assert {"copy", "reverse", "addition", "sorting", "summation", "parity", "polynomial"} == set(paper_tasks())
