"""RULER-style task generators (posenc_cli.data.ruler): needles at the requested depth, prompts of the requested token
length (bytes and BPE), and every episode solvable from the prompt alone by a regular expression (100%). The tasks
whose context is the episode (CWE, FWE, KV) fill the prompt at each length, or refuse a length too short for them."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pytest

from posenc_cli.data.ruler import registry
from posenc_cli.data.ruler.base import (
    ContextTask,
    PromptTooShort,
    build_prompts,
    episode_text,
    fill_episodes,
    fixed_chars,
    haystack_text,
)
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
    if task == "common-words":
        (n,) = re.findall(r"What are the (\d+) most common words in the list\? The \d+ most common words are$", prompt)
        return top(re.findall(r" \d+\. ([a-z]+)", prompt), int(n))
    if task == "frequent-words":
        (text,) = re.findall(r"Coded text:((?: \S+)+) Ignore the dots\.", prompt)
        return top([w for w in text.split() if w != "..."], 3)
    if task == "kv-retrieval":
        (key,) = re.findall(r'What is the value of "(\w+)"\? The value of "\w+" is$', prompt)
        return re.findall(rf'"{key}": "(\w+)"', prompt)
    raise AssertionError(f"no solver for {task}: add one when adding a task")


def top(words: list[str], n: int) -> list[str]:
    """The `n` most frequent words, most frequent first (ties in first-seen order); the n-th must beat the next."""
    ranked = Counter(words).most_common()
    assert len(ranked) >= n and (len(ranked) == n or ranked[n - 1][1] > ranked[n][1]), "no unique answer"
    return [w for w, _ in ranked[:n]]


def same_answers(task: str, found: list[str], answers: tuple[str, ...]) -> bool:
    """Aggregation tasks are scored as a set (string_match_all); ranks that tie cannot be ordered from the text."""
    return sorted(found) == sorted(answers) if task in ("common-words", "frequent-words") else found == list(answers)


@pytest.fixture(scope="module")
def bpe():
    texts = make_documents(TasksDataConfig(max_len=300), 400, 0, None)
    return train_bpe(texts, 400)


@pytest.fixture(params=sorted(registry()))
def task(request: pytest.FixtureRequest):
    return registry()[request.param]


def episodes(task, n: int = 8, seed: int = 0, tok=None, length: int | None = None, reserve: int | None = None):
    """`n` episodes at the depths; a context task's filled to `length` tokens of `tok` (when given), `reserve` of
    them left for the continuation (None: the answer)."""
    rng = np.random.default_rng(seed)
    if issubclass(task, ContextTask) and length is not None:
        drafts = [task.draft(rng, DEPTHS[i % len(DEPTHS)], room=length - task.tokens_to_generate) for i in range(n)]
        return fill_episodes(tok, drafts, length, reserve)
    return [task.sample(rng, DEPTHS[i % len(DEPTHS)]) for i in range(n)]


@pytest.mark.parametrize("kind", ["byte", "bpe"])
@pytest.mark.parametrize("length", [320, 600, 1000])
@pytest.mark.parametrize("haystack", ["filler", "corpus"])
def test_prompts_have_the_length_needles_at_the_depth_and_solve_by_regex(
    task, kind: str, length: int, haystack: str, bpe
) -> None:
    tok = ByteTokenizer() if kind == "byte" else bpe
    try:
        eps = episodes(task, tok=tok, length=length)
    except PromptTooShort as e:  # only a context task can be too big for a length, and it says what it needs
        assert issubclass(task, ContextTask) and "shorter than the smallest prompt" in str(e), e
        return
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
        assert n == 0 or abs((start - 1 - before) / n - ep.depths[0]) <= 0.5 / n + 1e-9
        prompt = tok.decode(row).rstrip()
        assert same_answers(task.name, solve(task.name, prompt), ep.answers)  # from the prompt alone
        answer = tok.decode(batch.answers[r, : batch.answer_len[r]])
        assert task.score(answer, ep.answers) == 1.0


def test_training_text_is_solvable_and_places_the_needle(task) -> None:
    for k, ep in enumerate(episodes(task, 20, seed=1)):
        hay = haystack_text(CORPUS if k % 2 else None, 200, np.random.default_rng(k))
        prompt, answer = episode_text(ep, hay)
        assert same_answers(task.name, solve(task.name, prompt), ep.answers)
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
    plain = [d for d in mixed if "?" not in d]  # every task's question asks one; the corpus has none
    assert 60 < len(plain) < 140 and all(d in CORPUS for d in plain)
    assert make_documents(only, 10, 0, None) == make_documents(only, 10, 0, None)


CONTEXT_TASKS = sorted(name for name, t in registry().items() if issubclass(t, ContextTask))


@pytest.mark.parametrize("name", CONTEXT_TASKS)
@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_context_tasks_fill_every_length_and_solve_by_regex_on_many_seeds(name: str, kind: str, bpe) -> None:
    """CWE, FWE and KV over 6 seeds × 5 lengths: the context fills the prompt (the filler pad is less than a few
    units), the solver finds the answer from the prompt text alone every time (100%), and the context grows with the
    length. A length too short for the smallest episode is refused, never shrunk."""
    tok, task = (ByteTokenizer() if kind == "byte" else bpe), registry()[name]
    solved, sizes = 0, {}
    for length in (128, 256, 512, 1024, 2048):
        for seed in range(6):
            try:
                eps = episodes(task, 3, seed, tok, length, task.tokens_to_generate)
            except PromptTooShort as e:
                assert "shorter than the smallest prompt" in str(e) or "vocabulary of" in str(e), e
                continue
            batch = build_prompts(tok, eps, length, None, task.tokens_to_generate)
            assert batch.prompts.shape == (3, length - task.tokens_to_generate)
            assert (batch.n_hay < 64).all(), batch.n_hay  # the pad: what is left when one more unit does not fit
            for r, ep in enumerate(eps):
                assert same_answers(name, solve(name, tok.decode(batch.prompts[r]).rstrip()), ep.answers)
                solved += 1
            sizes[length] = len(eps[0].needles[0])
    assert solved >= 3 * 6 * 2  # at least two lengths measured
    assert list(sizes.values()) == sorted(sizes.values()) and len(set(sizes.values())) == len(sizes)


def test_kv_pair_sits_at_the_depth_and_cwe_fwe_follow_rulers_counts() -> None:
    tok, tasks = ByteTokenizer(), registry()
    for depth, want in ((0.0, 0), (1.0, -1)):
        (ep,) = fill_episodes(tok, [tasks["kv-retrieval"].draft(np.random.default_rng(1), depth)], 1024, 128)
        pairs = re.findall(r'"(\w+)": "(\w+)"', ep.needles[0])
        assert len(pairs) > 20 and pairs[want][1] == ep.answers[0]
    (mid,) = fill_episodes(tok, [tasks["kv-retrieval"].draft(np.random.default_rng(1), 0.5)], 1024, 128)
    pairs = re.findall(r'"(\w+)": "(\w+)"', mid.needles[0])
    assert [v for _, v in pairs].index(mid.answers[0]) == round(0.5 * (len(pairs) - 1))
    (cwe,) = fill_episodes(tok, [tasks["common-words"].draft(np.random.default_rng(2), 0.0)], 2048, 120)
    counts = Counter(re.findall(r" \d+\. ([a-z]+)", cwe.needles[0]))
    assert {counts[w] for w in cwe.answers} == {6} and set(counts.values()) == {6, 1}  # short-context 6 / 1
    numbers = [int(k) for k in re.findall(r" (\d+)\. ", cwe.needles[0])]
    assert numbers == list(range(1, len(numbers) + 1))  # RULER's "1. word 2. word ..."
    room = 2048 - 50
    (fwe,) = fill_episodes(tok, [tasks["frequent-words"].draft(np.random.default_rng(3), 0.0, room=room)], 2048, 50)
    words = fwe.needles[0].split()[2:]  # after " Coded text:"
    assert all(re.fullmatch(r"[a-z]{6}", w) for w in set(words) - {"..."})  # RULER's 6-letter coded words
    assert len(set(words)) <= room // 50  # vocabulary: prompt tokens // 50
    seen = sorted(Counter(words).values(), reverse=True)

    def zipf(n: int) -> list[int]:  # floor(N k^-2 / zeta(2)), ranks past 4 held below rank 4
        counts = [math.floor(n * k**-2 / (math.pi**2 / 6)) for k in range(1, room // 50 + 1)]
        return sorted([c for c in counts[:4] + [min(c, counts[3] - 1) for c in counts[4:]] if c], reverse=True)

    assert any(zipf(n) == seen for n in range(27, 4000)) and Counter(words).most_common(1)[0][0] == "..."
    assert {w for w, _ in Counter(w for w in words if w != "...").most_common(3)} == set(fwe.answers)


@pytest.mark.parametrize("name", CONTEXT_TASKS)
def test_context_training_text_grows_to_the_characters_asked(name: str) -> None:
    """`sample_chars` (training text of about a length): the most units that fit, the smallest episode when none
    does, solvable from the text alone."""
    task, sizes = registry()[name], []
    for chars in (100, 400, 1500, 4000):
        for seed in range(4):
            ep = task.sample_chars(np.random.default_rng(seed), 0.5, chars)
            prompt, _ = episode_text(ep, haystack_text(None, max(chars - fixed_chars(ep), 0)))
            assert same_answers(name, solve(name, prompt), ep.answers)
            smallest = task.sample(np.random.default_rng(seed), 0.5)
            assert fixed_chars(ep) <= chars or ep == smallest
        sizes.append(fixed_chars(ep))
    assert sizes == sorted(sizes) and sizes[-1] > 3000
