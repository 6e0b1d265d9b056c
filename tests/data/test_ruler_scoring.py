"""RULER-faithful scoring and sizes (NVIDIA/RULER c3f5e3b): `string_match_all` on hand examples, RULER's sizes and
generation budgets as defaults, prompt + generated tokens filling the length, and the cell key naming the scoring."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from posenc_cli.data.ruler import registry
from posenc_cli.data.ruler.base import Sizes, exact_score, string_match_all, until_end
from posenc_cli.data.sources.stdlib import StdlibDataConfig
from posenc_cli.data.sources.tasks import TasksDataConfig, corpus_info, make_documents
from posenc_cli.data.tokenizer import ByteTokenizer
from posenc_cli.errors import ConfigError
from posenc_cli.evaluation.tasks import retrieval


def test_string_match_all_is_rulers_on_hand_examples() -> None:
    # constants.py:28: sum over refs of (r.lower() in pred.lower()) / len(refs)
    assert string_match_all(" 1234567", ["1234567"]) == 1.0
    assert string_match_all(" The apple key is 1234567. Then more text", ["1234567"]) == 1.0  # contained, not exact
    assert string_match_all(" abcde, fghij", ["ABCDE", "FGHIJ"]) == 1.0  # case-insensitive
    assert string_match_all(" ABCDE", ["abcde"]) == 1.0
    assert string_match_all(" 1111111, 3333333 and so on", ["1111111", "2222222", "3333333", "4444444"]) == 0.5
    assert string_match_all(" nothing here", ["1111111", "2222222"]) == 0.0
    # posenc's stricter score keeps its meaning: exact for one answer, case-sensitive containment for several
    assert exact_score(" 1234567. Then", ["1234567"]) == 0.0 and exact_score(" 1234567 ", ["1234567"]) == 1.0
    assert exact_score(" abcde, FGHIJ", ["ABCDE", "FGHIJ"]) == 0.5
    task = registry()["niah-multivalue"]
    assert task.score(" 1111111 x 2222222", ["1111111", "2222222", "3333333", "4444444"]) == 0.5  # default: contains
    assert task.score(" xx 1111111", ["1111111"], "exact") == 0.0


def test_default_sizes_are_rulers() -> None:
    # scripts/synthetic.yaml: niah_multikey_1 4 keys, niah_multivalue 4 values, niah_multiquery 4 queries, vt 4 hops;
    # niah.py:108 7 digits; variable_tracking.py:96,110 5-letter names and a 5-digit value
    assert Sizes() == Sizes(keys=4, values=4, queries=4, hops=4, digits=7, vt_digits=5, letters=5)
    rng = np.random.default_rng(0)
    tasks = registry()
    for _ in range(20):
        mk = tasks["niah-multikey"].sample(rng, 0.5)
        assert len(mk.needles) == 4 and len(mk.answers) == 1 and re.fullmatch(r"[1-9]\d{6}", mk.answers[0])
        mv = tasks["niah-multivalue"].sample(rng, 0.5)
        assert len(mv.answers) == 4 and all(re.fullmatch(r"[1-9]\d{6}", a) for a in mv.answers)
        mq = tasks["niah-multiquery"].sample(rng, 0.5)
        assert len(mq.answers) == 4 and len(mq.needles) == 4
        vt = tasks["variable-tracking"].sample(rng, 0.5)
        assert len(vt.answers) == 5 and all(re.fullmatch(r"[A-Z]{5}", a) for a in vt.answers)  # 1 chain, 4 hops
        assert re.search(r"= [1-9]\d{4}\.", vt.needles[0])
        single = tasks["niah-single"].sample(rng, 0.5, Sizes(digits=3))
        assert re.fullmatch(r"[1-9]\d{2}", single.answers[0])


def test_generation_budget_per_task_is_rulers() -> None:
    # scripts/data/synthetic/constants.py: tokens_to_generate 128 for niah, 30 for variable_tracking, 120 for
    # common_words_extraction, 50 for freq_words_extraction; kv-retrieval retrieves one value as niah does
    budgets = {name: task.tokens_to_generate for name, task in registry().items()}
    assert budgets == {
        "common-words": 120,
        "frequent-words": 50,
        "kv-retrieval": 128,
        "niah-multikey": 128,
        "niah-multiquery": 128,
        "niah-multivalue": 128,
        "niah-single": 128,
        "variable-tracking": 30,
    }


class _Scheme:
    name, max_length = "none", None


class _Model(torch.nn.Module):
    scheme = _Scheme()


def _fake_decoder(rows: list[np.ndarray], calls: list[tuple[int, int, int]]):
    """A decode_prompts stand-in: row r generates the ids `rows[r]`, then "x" bytes."""

    def decode(model, prompts, steps, length, *args, **kwargs):
        calls.append((prompts.shape[1], steps, length))
        out = np.full((len(prompts), steps), ord("x"), dtype=np.int64)
        for r, ids in enumerate(rows):
            out[r, : min(len(ids), steps)] = ids[:steps]
        return out

    return decode


@pytest.mark.parametrize(("name", "budget"), [("niah-multivalue", None), ("variable-tracking", 40)])
def test_prompt_and_budget_fill_the_length_and_contains_scores(
    name: str, budget: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok, task, length = ByteTokenizer(), registry()[name], 400
    rng = retrieval.cell_rng(task.name, 0, length, 0.5)
    episodes = [task.sample(rng, 0.5) for _ in range(2)]
    # row 0: every answer, lower-cased, in reverse order; row 1: the first answer, then the end-of-document token
    # (generation stops there), then the other answers
    first, *rest = episodes[1].answers
    rows = [
        tok.encode(" " + " ".join(a.lower() for a in reversed(episodes[0].answers))),
        np.concatenate([tok.encode(" " + first), [tok.eod_id], tok.encode(" " + " ".join(rest))]),
    ]
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(retrieval, "decode_prompts", _fake_decoder(rows, calls))
    (cell,) = retrieval.evaluate_task_model(_Model(), tok, task, length=length, depths=[0.5], trials=2, generate=budget)
    n = len(episodes[0].answers)
    assert cell["score"] == pytest.approx((1.0 + 1 / n) / 2) and cell["exact"] == 0.5
    (prompt_len, steps, total) = calls[0]
    assert steps == (budget or task.tokens_to_generate) and prompt_len + steps == total == length  # RULER: niah.py:245

    calls.clear()
    retrieval.evaluate_task_model(_Model(), tok, task, length=length, depths=[0.5], trials=2, generate=50)
    assert calls[0][1] == 50 and calls[0][0] == length - 50

    calls.clear()  # exact: only the answer's tokens are generated (its leading space ends the prompt)
    retrieval.evaluate_task_model(_Model(), tok, task, length=length, depths=[0.5], trials=2, scoring="exact")
    width = max(len(ep.answer_text) - 1 for ep in episodes)
    assert calls[0][1] == width and calls[0][0] + width == length


def test_output_after_the_end_of_document_token_is_not_scored() -> None:
    tok = ByteTokenizer()
    ids = np.concatenate([tok.encode(" 1234567"), [tok.eod_id], tok.encode(" 7654321")])
    assert tok.decode(until_end(ids, tok.eod_id)) == " 1234567"
    assert string_match_all(tok.decode(until_end(ids, tok.eod_id)), ["7654321"]) == 0.0


def test_a_budget_shorter_than_the_answer_is_na_not_a_capped_score(monkeypatch: pytest.MonkeyPatch) -> None:
    tok, task = ByteTokenizer(), registry()["niah-multivalue"]
    monkeypatch.setattr(retrieval, "decode_prompts", _fake_decoder([], []))
    with pytest.raises(retrieval.PromptTooShort, match="cannot hold the longest answer"):
        retrieval.evaluate_task_model(_Model(), tok, task, length=400, depths=[0.0], trials=2, generate=5)
    # RULER's 30 tokens for VT hold five 5-letter names in a subword tokenizer, not in bytes (34)
    vt = registry()["variable-tracking"]
    with pytest.raises(retrieval.PromptTooShort, match="30 generated tokens cannot hold .* --tokens-to-generate"):
        retrieval.evaluate_task_model(_Model(), tok, vt, length=400, depths=[0.0], trials=2)


def test_cells_are_keyed_by_scoring_budget_and_sizes() -> None:
    cell = {"task": "niah-single", "length": 128, "depth": 0.5, "trials": 2, "seed": 0, "haystack": "filler"}
    cell |= {"dtype": "fp32", "generator": 3, "checkpoint": {"step": 1, "model_sha256": "a"}}
    contains = {**cell, "sizes": {"digits": 7}, "scoring": "contains", "generate": 128}
    keys = {
        retrieval.entry_key(contains),
        retrieval.entry_key({**contains, "generate": 30}),
        retrieval.entry_key({**contains, "scoring": "exact", "generate": None}),
        retrieval.entry_key({**contains, "sizes": {"digits": 4}}),
        retrieval.entry_key({**cell, "digits": 4, "generator": 2}),  # measured before this change
    }
    assert len(keys) == 5
    # a cell from before scoring was recorded was scored exactly on the answer's tokens
    old = retrieval.entry_key({**cell, "digits": 7})
    assert old == retrieval.entry_key({**contains, "scoring": "exact", "generate": None})


def test_a_run_is_asked_its_mixtures_sizes_and_budget_unless_flags_say_otherwise() -> None:
    def run(data):
        return SimpleNamespace(config=SimpleNamespace(data=data))

    mixture = TasksDataConfig(hops=2, letters=3, tokens_to_generate=24)
    assert retrieval.run_sizes(run(mixture), retrieval.TasksEvalConfig()) == (Sizes(hops=2, letters=3), 24)
    flags = retrieval.TasksEvalConfig(sizes={"hops": 3}, digits=5)
    assert retrieval.run_sizes(run(mixture), flags) == (Sizes(hops=3, letters=3, digits=5), 24)
    assert retrieval.run_sizes(run(StdlibDataConfig()), retrieval.TasksEvalConfig()) == (Sizes(), None)


def test_mixture_sizes_are_validated_and_only_they_change_the_fingerprint() -> None:
    with pytest.raises(ConfigError, match="data.keys must be at most 40"):
        TasksDataConfig(keys=41).validate()
    with pytest.raises(ConfigError, match="data.hops must be at most 256"):
        TasksDataConfig(hops=10**9).validate()
    with pytest.raises(ConfigError, match="data.tokens_to_generate"):
        TasksDataConfig(tokens_to_generate=0).validate()
    base = corpus_info(TasksDataConfig(), None)
    assert corpus_info(TasksDataConfig(tokens_to_generate=32), None) == base  # an evaluation setting
    assert corpus_info(TasksDataConfig(hops=2), None) != base
    docs = make_documents(TasksDataConfig(tasks=["variable-tracking"], hops=2, letters=3), 20, 0, None)
    assert all(len(re.findall(r"VAR [A-Z]{3} =", d)) == 3 for d in docs)


def test_episodes_that_cannot_fit_in_memory_are_refused_before_allocation() -> None:
    retrieval.check_memory(30, 4096, 128, "--trials", available=2**30)  # 30 episodes: a few MiB
    with pytest.raises(ConfigError, match=r"--trials: 3,000,000 episodes .* need about .* GiB"):
        retrieval.check_memory(3_000_000, 4096, 128, "--trials", available=2**30)
    with pytest.raises(ConfigError, match="--trials"):  # the up-front bound in validate, before any run is read
        retrieval.TasksEvalConfig(trials=10**9).validate()


@pytest.mark.parametrize("name", ["common-words", "frequent-words", "kv-retrieval"])
def test_context_tasks_fill_the_length_under_both_scorings(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """CWE, FWE and KV: prompt + budget (contains) or prompt + the longest answer (exact) = the length, every
    episode's context grown to fill it; CWE and FWE cells have no depth, and a correct output scores 1."""
    tok, task, length = ByteTokenizer(), registry()[name], 1024
    depths = [0.0, 1.0] if task.has_depth else [None]
    for scoring in ("contains", "exact"):
        calls: list[tuple[int, int, int]] = []
        eps = retrieval.sample_episodes(tok, task, length, depths, 2, Sizes(), 0, None)
        answers = [tok.encode(ep.answer_text[1:]) for ep in eps]  # generate exactly the answer
        monkeypatch.setattr(retrieval, "decode_prompts", _fake_decoder(answers, calls))
        budget = task.tokens_to_generate if scoring == "contains" else None
        grid = {"length": length, "depths": depths, "trials": 2, "scoring": scoring}
        cells = retrieval.evaluate_task_model(_Model(), tok, task, **grid)
        (prompt_len, steps, total) = calls[0]
        width = max(len(a) for a in answers)
        assert prompt_len + steps == total == length and steps == (budget or width)
        assert [c["depth"] for c in cells] == depths and all(c["score"] == 1.0 for c in cells), cells
    with pytest.raises(retrieval.PromptTooShort, match="length 200"):
        retrieval.evaluate_task_model(_Model(), tok, task, length=200, depths=depths, trials=2)
