"""RULER-style task generators (posenc_cli.data.ruler): needles at the requested depth, prompts of the requested token
length (bytes and BPE), and every episode solvable from the prompt alone by a regular expression (100%)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from posenc_cli.data.ruler import registry
from posenc_cli.data.ruler.base import PromptTooShort, build_prompts, episode_text, haystack_text
from posenc_cli.data.sources.tasks import TasksDataConfig, make_documents
from posenc_cli.data.tokenizer import ByteTokenizer, train_bpe

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
CORPUS = "def f(x):\n    return x + 1\n\nclass A:\n    pass\n" * 40


def solve(task: str, prompt: str) -> list[str]:
    """The expected answers read from the prompt text alone (independent of the generator's code)."""
    if task in ("niah-single", "niah-multikey"):
        (key,) = re.findall(r"What is the (\w+) key\? The \w+ key is$", prompt)
        return re.findall(rf"The {key} key is (\d+)\.", prompt)
    if task == "niah-multivalue":
        (key,) = re.findall(r"What are all the (\w+) keys\? The \w+ keys are$", prompt)
        return re.findall(rf"The {key} key is (\d+)\.", prompt)
    if task == "niah-multiquery":
        (keys,) = re.findall(r"What are the ([\w ]+) keys\? The [\w ]+ keys are$", prompt)
        return [re.findall(rf"The {k} key is (\d+)\.", prompt)[0] for k in keys.split(" and ")]
    if task == "variable-tracking":
        (value,) = re.findall(r"Which variables hold (\d+)\? The variables holding \d+ are$", prompt)
        holding = re.findall(rf"VAR ([A-Z]+) = {value}\.", prompt)
        for name, previous in re.findall(r"VAR ([A-Z]+) = VAR ([A-Z]+)\.", prompt):  # in text order
            if previous in holding:
                holding.append(name)
        return holding
    raise AssertionError(f"no solver for {task}: add one when adding a task")


@pytest.fixture(scope="module")
def bpe():
    texts = make_documents(TasksDataConfig(max_len=300), 400, 0, None)
    return train_bpe(texts, 400)


@pytest.fixture(params=sorted(registry()))
def task(request: pytest.FixtureRequest):
    return registry()[request.param]


def episodes(task, n: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [task.sample(rng, DEPTHS[i % len(DEPTHS)]) for i in range(n)]


@pytest.mark.parametrize("kind", ["byte", "bpe"])
@pytest.mark.parametrize("length", [320, 600, 1000])
@pytest.mark.parametrize("haystack", ["filler", "corpus"])
def test_prompts_have_the_length_needles_at_the_depth_and_solve_by_regex(
    task, kind: str, length: int, haystack: str, bpe
) -> None:
    tok = ByteTokenizer() if kind == "byte" else bpe
    eps = episodes(task)
    hay = None if haystack == "filler" else np.asarray(tok.encode(CORPUS), dtype=np.int64)
    batch = build_prompts(tok, eps, length, hay)
    width = batch.answers.shape[1]
    assert batch.prompts.shape == (len(eps), length - width)  # prompt + the longest answer = length tokens
    assert (batch.answer_len <= width).all() and (batch.prompts[:, 0] == tok.eod_id).all()
    for r, ep in enumerate(eps):
        row, n = batch.prompts[r], int(batch.n_hay[r])
        for i, needle in enumerate(ep.needles):  # every needle's tokens sit where the batch says
            ids = tok.encode(needle)
            start = batch.needle_starts[r][i]
            assert row[start : start + len(ids)].tolist() == ids.tolist()
        # haystack tokens before the first needle: round(depth · haystack tokens)
        start = batch.needle_starts[r][0]
        before = sum(
            len(tok.encode(ep.needles[i])) for i in range(len(ep.needles)) if batch.needle_starts[r][i] < start
        )
        assert start - 1 - before == round(ep.depths[0] * n)
        assert abs((start - 1 - before) / max(n, 1) - ep.depths[0]) <= 0.5 / max(n, 1) + 1e-9
        prompt = tok.decode(row).rstrip()
        assert solve(task.name, prompt) == list(ep.answers)  # the answer follows from the prompt alone
        answer = tok.decode(batch.answers[r, : batch.answer_len[r]])
        assert task.score(answer, ep.answers) == 1.0


def test_training_text_is_solvable_and_places_the_needle(task) -> None:
    for k, ep in enumerate(episodes(task, 20, seed=1)):
        hay = haystack_text(CORPUS if k % 2 else None, 200, np.random.default_rng(k))
        prompt, answer = episode_text(ep, hay)
        assert solve(task.name, prompt) == list(ep.answers)
        assert answer == " " + ", ".join(ep.answers)
        at = prompt.index(ep.needles[0])
        others = sum(len(n) for n in ep.needles[1:] if prompt.index(n) < at)
        assert at - others == round(ep.depths[0] * 200)


def test_sampling_is_seeded_and_scoring_is_ruler_s(task) -> None:
    assert episodes(task, 5, seed=3) == episodes(task, 5, seed=3)
    ep = episodes(task, 1)[0]
    assert task.score(" " + ", ".join(ep.answers), ep.answers) == 1.0
    assert task.score(" nothing", ep.answers) == 0.0
    if len(ep.answers) > 1:  # multi-answer: the share of answers present
        assert task.score(ep.answers[0], ep.answers) == pytest.approx(1 / len(ep.answers))


def test_too_short_a_length_is_refused(task) -> None:
    with pytest.raises(PromptTooShort):
        build_prompts(ByteTokenizer(), episodes(task, 2), 20)


def test_the_mixture_follows_its_settings() -> None:
    only = TasksDataConfig(tasks=["niah-single"], episodes=50, max_len=200)
    docs = make_documents(only, 50, 0, None)
    assert all(solve("niah-single", d.rsplit(" ", 1)[0]) for d in docs)
    mixed = make_documents(TasksDataConfig(corpus_share=0.5, max_len=100), 200, 0, CORPUS)
    plain = [d for d in mixed if "key" not in d and "VAR" not in d]
    assert 60 < len(plain) < 140 and all(d in CORPUS for d in plain)
    assert make_documents(only, 10, 0, None) == make_documents(only, 10, 0, None)
