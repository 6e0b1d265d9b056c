"""LongRoPE's evolutionary search (posenc_cli/extension/longrope_search.py): the pure pieces (constraint, seeds,
mutation,
crossover) as properties, and a tiny end-to-end search that writes a child run."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from train_utils import tiny_config, write_corpus

from posenc_cli.config import ExtendConfig
from posenc_cli.errors import ConfigError
from posenc_cli.extension.longrope_search import (
    FACTORS_FILE,
    constrain,
    crossover,
    initial_candidates,
    mutate,
    search_bounds,
)
from posenc_cli.extension.plan import SearchThenScale, execute
from posenc_cli.rope_scaling.frequencies import scaled_inv_freq
from posenc_cli.rope_scaling.longrope import read_factors_file
from posenc_cli.run.load import load_run
from posenc_cli.run.train import train

FACTOR = 4.0
LOW, HIGH = search_bounds(FACTOR)
values = st.lists(st.floats(min_value=0.01, max_value=50.0, allow_nan=False), min_size=1, max_size=32)


def is_valid(values: list[float], low: float, high: float) -> bool:
    """Within [low, high] and non-decreasing: the search space's constraints."""
    return all(low <= v <= high for v in values) and all(a <= b for a, b in itertools.pairwise(values))


@settings(deadline=None)  # no wall-clock limit: the machine may be loaded
@given(values)
def test_constrain_is_a_valid_projection_and_idempotent(xs: list[float]) -> None:
    c = constrain(xs, LOW, HIGH)
    assert len(c) == len(xs) and is_valid(c, LOW, HIGH)
    assert constrain(c, LOW, HIGH) == c  # identity on valid candidates


@settings(max_examples=60, deadline=None)
@given(values, st.integers(0, 2**32 - 1))
def test_mutation_stays_in_the_space_and_is_seeded(xs: list[float], seed: int) -> None:
    parent = constrain(xs, LOW, HIGH)
    child = mutate(parent, random.Random(seed), LOW, HIGH)
    assert len(child) == len(parent) and is_valid(child, LOW, HIGH)
    assert child == mutate(parent, random.Random(seed), LOW, HIGH)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 32).flatmap(lambda n: st.tuples(*[values.map(lambda v, n=n: (v * n)[:n])] * 2)), st.integers(0, 99)
)
def test_crossover_takes_each_value_from_a_parent(parents: tuple[list[float], list[float]], seed: int) -> None:
    a, b = (constrain(p, LOW, HIGH) for p in parents)
    child = crossover(a, b, random.Random(seed), LOW, HIGH)
    assert is_valid(child, LOW, HIGH) and len(child) == len(a)
    assert set(child) <= set(a) | set(b)
    assert crossover(a, a, random.Random(seed), LOW, HIGH) == a


def test_crossover_refuses_parents_of_different_lengths() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        crossover((1.0, 2.0), (1.0,), random.Random(0), LOW, HIGH)


@pytest.mark.parametrize(("head_dim", "length"), [(8, 16), (32, 128), (64, 4096)])
def test_seeds_are_pi_ntk_and_yarn(head_dim: int, length: int) -> None:
    """Each seed, used as long factors, gives its method's inverse frequencies (beyond L)."""
    seeds = initial_candidates(head_dim, 10000.0, FACTOR, length)
    assert list(seeds) == ["PI", "ntk", "yarn"]
    assert seeds["PI"] == (FACTOR,) * (head_dim // 2)
    for name, method in (("ntk", "ntk"), ("yarn", "yarn"), ("PI", "linear")):
        assert is_valid(seeds[name], LOW, HIGH)
        ours, _ = scaled_inv_freq("longrope", head_dim, 10000.0, FACTOR, length, 2 * length, long_factor=seeds[name])
        ref, _ = scaled_inv_freq(method, head_dim, 10000.0, FACTOR, length)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=0.0)


def extend_with_search(
    parent: Path, out: Path, ext: ExtendConfig, *, progress: Any = None, **search: int
) -> tuple[Any, Any]:
    """The search, then the scaling, as `extend --search` and a sweep's search stage run them (`extension.plan`)."""
    outcome = execute(SearchThenScale(run=parent, out=out, ext=ext, **search), progress=progress)
    return outcome.result, outcome.search


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("longrope-runs")
    corpus = write_corpus(root)
    out = {"rope": root / "rope", "alibi": root / "alibi"}
    train(tiny_config(corpus, pos="rope", steps=12), out["rope"])
    train(tiny_config(corpus, pos="alibi", steps=1), out["alibi"])
    return out


def test_tiny_search_beats_or_ties_its_seeds_and_writes_the_child(runs: dict[str, Path], tmp_path: Path) -> None:
    seen: list[tuple[int, int, float]] = []
    out = tmp_path / "child"
    ext = ExtendConfig(method="longrope", factor=FACTOR)
    result, found = extend_with_search(runs["rope"], out, ext, budget=4, seed=1, tokens=512,
                                       progress=lambda done, total, best: seen.append((done, total, best)))  # fmt: skip
    assert [(d, t) for d, t, _ in seen] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert len(found.history) == 4 and set(found.initial) == {"PI", "ntk", "yarn"}
    assert found.ppl <= found.initial_best and found.ppl == min(h["ppl"] for h in found.history)
    assert found.target_length == 4 * 16 and is_valid(found.long_factor, LOW, HIGH)
    assert result.status == "created" and result.method == "longrope"

    child = load_run(out)  # the config carries the factors, reloaded
    scaling = child.config.pos.scaling  # type: ignore[attr-defined]
    assert scaling.method == "longrope" and scaling.params.long_factor == found.long_factor
    assert scaling.params.short_factor == [1.0] * len(found.long_factor)
    assert read_factors_file(out / FACTORS_FILE) == {"short_factor": scaling.params.short_factor,
                                                     "long_factor": found.long_factor}  # fmt: skip
    assert json.loads((out / FACTORS_FILE).read_text())["search"]["seed"] == 1

    # the same search into the same child: decided done before searching (no candidate scored), factors unchanged
    seen.clear()
    again, found_again = extend_with_search(
        runs["rope"], out, ext, budget=4, seed=1, tokens=512, progress=lambda *a: seen.append(a)
    )
    assert again.status == "already_complete" and found_again is None and seen == []
    assert load_run(out).config.pos.scaling.params.long_factor == found.long_factor  # type: ignore[attr-defined]
    record = json.loads((out / "meta.json").read_text())["extend"]
    assert record["search"] == {"budget": 4, "seed": 1, "tokens": 512, "data": found.data}


def test_another_search_into_the_child_is_refused_naming_what_differs(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "child"
    ext = ExtendConfig(method="longrope", factor=FACTOR)
    extend_with_search(runs["rope"], out, ext, budget=2, seed=1, tokens=128)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir())
    never = lambda *_: pytest.fail("the search ran before the refusal")  # noqa: E731
    with pytest.raises(ConfigError, match=r"different extension \(other search.seed: 1 there, 2 asked\)"):
        extend_with_search(runs["rope"], out, ext, budget=2, seed=2, tokens=128, progress=never)
    with pytest.raises(ConfigError, match=r"\(other search.tokens: 128 there, 256 asked\)"):
        extend_with_search(runs["rope"], out, ext, budget=2, seed=1, tokens=256, progress=never)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir()) == before


def _scored_windows(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[torch.Tensor]:
    """Every input batch the models built by `module.name` (or given to it) are run on."""
    seen: list[torch.Tensor] = []
    real = getattr(module, name)

    def spying(*args: object, **kwargs: object) -> torch.nn.Module:
        model = real(*args, **kwargs)
        model.register_forward_pre_hook(lambda _m, inputs: seen.append(inputs[0].detach().clone()))
        return model

    monkeypatch.setattr(module, name, spying)
    return seen


def test_search_scores_no_token_that_an_evaluation_scores(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search's scored windows come from the training split (at the offsets recorded in the child), while every
    evaluation protocol scores the validation split: no search window occurs in what eval-extrapolate scores, in
    any protocol (the same windows at s·L were scored by both before the search was held apart)."""
    import posenc_cli.extension.longrope_search as search_module
    from posenc_cli.config import EvalConfig
    from posenc_cli.data.cache import load_corpus
    from posenc_cli.evaluation.tasks.extrapolate import evaluate_run

    searched = _scored_windows(monkeypatch, search_module, "build_model")
    out = tmp_path / "child"
    _, found = extend_with_search(runs["rope"], out, ExtendConfig(method="longrope", factor=FACTOR), budget=1,
                                  seed=0, tokens=256)  # fmt: skip
    assert found is not None and searched
    windows = torch.cat(searched)  # (N, s·L): every candidate scored the same windows
    run = load_run(runs["rope"])
    corpus = load_corpus(run.config.data, run.config.tokenizer, tokenizer=run.tokenizer)
    data = json.loads((out / "meta.json").read_text())["extend"]["search"]["data"]
    assert data["fingerprint"] == corpus.info["fingerprint"]
    stream = torch.from_numpy(getattr(corpus, data["split"])[data["start"] : data["end"]].astype("int64"))
    length = found.target_length
    assert all(
        torch.equal(w, stream[k * length : (k + 1) * length]) for k, w in enumerate(windows[: len(stream) // length])
    )

    evaluated: list[torch.Tensor] = []
    run.model.register_forward_pre_hook(lambda _m, inputs: evaluated.append(inputs[0].detach().clone()))
    for protocol in ("nonoverlap", "sliding", "fixed-target"):
        evaluate_run(run, EvalConfig(protocol=protocol, abs_lengths=[length], tokens=16384), store=False)
    scored = {bytes(row.numpy().astype("int32").tobytes()) for batch in evaluated for row in batch}
    text = b"|".join(scored)
    assert evaluated
    shared = [k for k, w in enumerate(windows) if w.numpy().astype("int32").tobytes() in text]
    assert shared == []  # search windows that an evaluation also scored
    assert data["split"] == "train"  # evaluations read only "val"


def test_search_refuses_other_schemes_and_methods_writing_nothing(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "child"
    with pytest.raises(ConfigError, match="uses pos=alibi; frequency scaling"):
        extend_with_search(runs["alibi"], out, ExtendConfig(method="longrope", factor=FACTOR), budget=2)
    with pytest.raises(ConfigError, match="use it with --longrope, not --method yarn"):
        extend_with_search(runs["rope"], out, ExtendConfig(method="yarn", factor=FACTOR), budget=2)
    with pytest.raises(ConfigError, match="--search-budget must be >= 1"):
        extend_with_search(runs["rope"], out, ExtendConfig(method="longrope", factor=FACTOR), budget=0)
    assert not out.exists()
    never = lambda *_: pytest.fail("the search ran before the refusal")  # noqa: E731
    ext = ExtendConfig(method="longrope", factor=FACTOR)
    with pytest.raises(ConfigError, match="is the parent run"):
        extend_with_search(runs["rope"], runs["rope"], ext, budget=2, progress=never)
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not empty"):
        extend_with_search(runs["rope"], tmp_path / "user", ext, budget=2, progress=never)
