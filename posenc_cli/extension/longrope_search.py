"""LongRoPE's evolutionary search for the long factors (Ding et al. 2024, arXiv 2402.13753, §3.2 and Algorithm 1).

A candidate is one rescale factor λ_k per RoPE frequency pair (inv_k' = inv_k / λ_k beyond L tokens; see
`posenc_cli/rope_scaling/longrope.py`), inside the search space [1, 1.25·s] and non-decreasing over pairs (the
paper's monotone constraint: lower frequencies are interpolated at least as much as higher ones). The initial
population is the paper's: the λ that PI, NTK-aware scaling and YaRN amount to at this factor (`initial_candidates`),
then each generation keeps the best candidates as parents and adds children made by mutation (`mutate`) and
crossover (`crossover`), each projected back onto the constraints (`constrain`) and never scored twice. Every
candidate is scored by its perplexity at the target length s·L (non-overlapping windows, fp32), so the search costs
`budget` forward passes over `tokens` tokens. Left out: the paper's n̂ (first positions kept un-interpolated), which
`transformers`' longrope rope type has no place for.

Search data, held apart from every evaluation (`search_windows`): the reference searches on one corpus and evaluates
on another (microsoft/LongRoPE README.md:90: PG19 validation for the search, Proof-Pile test for the evaluation).
posenc's evaluations (`eval-extrapolate` in every protocol, fixed-target included, which scores the *end* of the
validation stream; the training run's own validation) only ever read the validation split, so the search scores the
first windows of the run's *training* split instead (`SEARCH_SPLIT`): no token it scores is scored by an evaluation
of the run's own data. Those tokens may have been trained on at length L (training samples windows of L anywhere in
the split), and they are other text than the evaluation's, so the search's perplexities are not the evaluation's
level; they only rank candidates at s·L, a length the model never trained at. The child records the tokens
used (`SearchResult.data`, in meta.json's `extend.search` and the factors file): split, token offsets [start, end)
and the corpus and tokenizer fingerprints.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from posenc_cli.config import ExtendConfig, replace
from posenc_cli.data.cache import eval_windows, load_corpus
from posenc_cli.errors import ConfigError
from posenc_cli.extension.child_run import check_same_keys, existing_child, recorded_extension
from posenc_cli.extension.extend import parent_train_length, require_rope
from posenc_cli.extension.limits import check_factor
from posenc_cli.extension.settings import check_parent, check_search_settings, validate_extend
from posenc_cli.fsutil import atomic_write_json
from posenc_cli.model import build_model
from posenc_cli.positional.rope import rotary_dim
from posenc_cli.rope_scaling import NONE, RopeScalingConfig
from posenc_cli.rope_scaling.frequencies import scaled_inv_freq
from posenc_cli.rope_scaling.longrope import LongRopeParams
from posenc_cli.run.device import threads as use_threads
from posenc_cli.run.drope import refuse_dropped
from posenc_cli.run.layout import MODEL_FILE
from posenc_cli.run.load import load_run

if TYPE_CHECKING:
    from posenc_cli.run.load import LoadedRun

__all__ = [
    "FACTORS_FILE",
    "SearchResult",
    "constrain",
    "crossover",
    "initial_candidates",
    "mutate",
    "search_bounds",
    "search_identity",
    "search_long_factors",
    "search_windows",
    "searched_factors",
    "write_factors",
]

FACTORS_FILE = "longrope_factors.json"  # in the child run: {"short_factor", "long_factor", "search": {...}}
SEARCH_SPLIT = "train"  # the split the search scores (see the module docstring: evaluations read only "val")
Candidate = tuple[float, ...]  # one λ per frequency pair
Progress = Callable[[int, int, float], None]  # (candidates scored, budget, best perplexity so far)

# ----------------------------------------------------------------------------------------------------------------
# Pure pieces: the search space, the seeds, mutation, crossover, the constraint.


def search_bounds(factor: float) -> tuple[float, float]:
    """[1, 1.25·s]: the paper's range for λ (no pair is sped up; at most 25% more interpolation than PI)."""
    return 1.0, 1.25 * factor


def constrain(values: Sequence[float], low: float, high: float) -> Candidate:
    """Clamp to [low, high], then sort: the nearest candidate (same values) that is non-decreasing over pairs.
    Identity on a valid candidate."""
    return tuple(sorted(min(max(float(v), low), high) for v in values))


def initial_candidates(head_dim: int, base: float, factor: float, original_length: int) -> dict[str, Candidate]:
    """The paper's seeds: λ_k = inv_k / inv_k' of PI (s everywhere), NTK-aware scaling and YaRN at this factor,
    computed with posenc's own implementations of those methods and constrained."""
    low, high = search_bounds(factor)
    plain, _ = scaled_inv_freq(NONE, head_dim, base, 1.0, original_length)
    out = {}
    for method in ("linear", "ntk", "yarn"):
        inv, _ = scaled_inv_freq(method, head_dim, base, factor, original_length)
        out[{"linear": "PI"}.get(method, method)] = constrain((plain.double() / inv.double()).tolist(), low, high)
    return out


def mutate(
    parent: Sequence[float], rng: random.Random, low: float, high: float, *, rate: float = 0.3, sigma: float = 0.2
) -> Candidate:
    """Each pair's λ multiplied by exp(N(0, sigma²)) with probability `rate` (at least one pair), then
    constrained (the paper's mutation within the search space, under the monotone constraint)."""
    values = list(parent)
    chosen = [k for k in range(len(values)) if rng.random() < rate] or [rng.randrange(len(values))]
    for k in chosen:
        values[k] *= math.exp(rng.gauss(0.0, sigma))
    return constrain(values, low, high)


def crossover(a: Sequence[float], b: Sequence[float], rng: random.Random, low: float, high: float) -> Candidate:
    """Each pair's λ from parent a or b at random (uniform crossover), then constrained."""
    if len(a) != len(b):
        raise ValueError(f"parents of different lengths {len(a)} and {len(b)}")
    return constrain([x if rng.random() < 0.5 else y for x, y in zip(a, b, strict=True)], low, high)


def children(
    parents: Sequence[Candidate], n: int, rng: random.Random, low: float, high: float, seen: set[Candidate]
) -> list[Candidate]:
    """Up to `n` new candidates (not in `seen`), alternating mutation of a parent and crossover of two."""
    out: list[Candidate] = []
    for attempt in range(50 * n):
        if len(out) == n:
            break
        if attempt % 2 == 0 or len(parents) < 2:
            child = mutate(rng.choice(parents), rng, low, high)
        else:
            a, b = rng.sample(list(parents), 2)
            child = crossover(a, b, rng, low, high)
        if child not in seen:
            seen.add(child)
            out.append(child)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Scoring and the search.


@dataclass
class SearchResult:
    """What the search found: the best long factors, their perplexity at s·L and how it got there."""

    long_factor: list[float]
    ppl: float
    initial: dict[str, float]  # perplexity of each seed (PI, ntk, yarn)
    history: list[dict[str, Any]] = field(default_factory=list)  # per candidate: origin, generation, ppl
    target_length: int = 0
    tokens: int = 0
    budget: int = 0
    seed: int = 0
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)  # the tokens scored: split, start, end, fingerprints

    @property
    def initial_best(self) -> float:
        return min(self.initial.values())

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def search_windows(run: LoadedRun, length: int, tokens: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """((N, length + 1) non-overlapping windows from the start of the run's training split, N·length ≈ tokens; the
    tokens they cover: split, [start, end) offsets in that split's stream, corpus and tokenizer fingerprints).

    The training split, never the validation split that every evaluation scores (see the module docstring)."""
    corpus = load_corpus(run.config.data, run.config.tokenizer, tokenizer=run.tokenizer)
    stream = getattr(corpus, SEARCH_SPLIT)
    windows = eval_windows(stream, length, length, max_windows=max(1, math.ceil(tokens / length)))
    data = {
        "split": SEARCH_SPLIT,
        "start": 0,
        "end": int(windows.shape[0]) * length + 1,  # exclusive; the first token is context only, never a target
        "fingerprint": str(corpus.info.get("fingerprint") or ""),
        "tokenizer_fingerprint": str(corpus.info.get("tokenizer_fingerprint") or ""),
    }
    return windows, data


def _scorer(run: LoadedRun, factor: float, original_length: int, windows: torch.Tensor) -> Callable[[Candidate], float]:
    """Candidate -> perplexity of the run's weights with those long factors on `windows` (fp32, CPU or the run's
    device), one model built per candidate (the config carries the factors, as a child run's would)."""
    state = run.model.state_dict()
    device = next(run.model.parameters()).device
    cfg = run.config

    def score(candidate: Candidate) -> float:
        params = LongRopeParams(long_factor=list(candidate))
        scaling = RopeScalingConfig(
            method="longrope", factor=float(factor), original_length=original_length, params=params
        )
        model = build_model(replace(cfg, pos=replace(cfg.pos, scaling=scaling)), run.tokenizer.vocab_size)
        model.load_state_dict(state)
        model.to(device).eval()
        total, count = 0.0, 0
        with torch.inference_mode():
            for batch in windows.split(max(1, 16384 // windows.shape[1])):
                batch = batch.to(device)
                logits = model(batch[:, :-1]).float()  # (B, T, V)
                loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1), reduction="sum")
                total, count = total + float(loss), count + batch[:, 1:].numel()
        nll = total / count
        return math.exp(nll) if nll < 700 else math.inf

    return score


def search_long_factors(
    run: LoadedRun,
    factor: float,
    original_length: int,
    *,
    budget: int = 16,
    seed: int = 0,
    tokens: int = 8192,
    population: int = 4,
    parents: int = 3,
    progress: Progress | None = None,
) -> SearchResult:
    """LongRoPE's long factors for RoPE run `run` at scale `factor` (target length round(s·L)), by evolutionary
    search scored on the start of the run's training split (`search_windows`). `budget` candidates are scored in
    all: the seeds first (PI, NTK, YaRN), then generations of `population` children of the best `parents`.
    Deterministic for a given `seed`. The result's perplexity is never above the best seed's (the seeds are
    candidates too)."""
    check_search_settings(budget, tokens)
    cfg = run.config
    if cfg.pos.name != "rope":
        raise ConfigError(f"{run.path} uses pos={cfg.pos.name}; LongRoPE applies only to RoPE checkpoints")
    head_dim = rotary_dim(cfg.model.head_dim, cfg.pos.rotary_fraction)  # type: ignore[attr-defined]
    base = float(cfg.pos.base)  # type: ignore[attr-defined]
    target = round(factor * original_length)
    t0 = time.perf_counter()
    windows, data = search_windows(run, target, tokens)  # (N, target + 1)
    score = _scorer(run, factor, original_length, windows)
    low, high = search_bounds(factor)
    rng = random.Random(seed)

    scored: list[tuple[float, Candidate]] = []
    history: list[dict[str, Any]] = []
    initial: dict[str, float] = {}

    def evaluate(candidate: Candidate, origin: str, generation: int) -> None:
        ppl = score(candidate)
        scored.append((ppl, candidate))
        history.append({"origin": origin, "generation": generation, "ppl": ppl})
        if progress is not None:
            progress(len(scored), budget, min(p for p, _ in scored))

    seeds = initial_candidates(head_dim, base, factor, original_length)
    seen: set[Candidate] = set()
    for name, candidate in seeds.items():
        if len(scored) == budget:
            break
        if candidate in seen:
            continue
        seen.add(candidate)
        evaluate(candidate, name, 0)
        initial[name] = scored[-1][0]
    generation = 0
    while len(scored) < budget:
        generation += 1
        best = [c for _, c in sorted(scored, key=lambda pc: pc[0])[:parents]]
        batch = children(best, min(population, budget - len(scored)), rng, low, high, seen)
        if not batch:
            break  # the space around the parents is exhausted (tiny rotary dims)
        for child in batch:
            evaluate(child, "mutation/crossover", generation)
    ppl, best_candidate = min(scored, key=lambda pc: pc[0])
    return SearchResult(
        long_factor=list(best_candidate),
        ppl=ppl,
        initial=initial,
        history=history,
        target_length=target,
        tokens=windows.shape[0] * target,
        budget=budget,
        seed=seed,
        seconds=round(time.perf_counter() - t0, 3),
        data=data,
    )


def write_factors(out_dir: Path | str, short_factor: Sequence[float], result: SearchResult) -> Path:
    """`FACTORS_FILE` in the child run (atomic): the factors as `--factors FILE` reads them, plus the search."""
    path = Path(out_dir) / FACTORS_FILE
    doc = {"short_factor": list(short_factor), "long_factor": result.long_factor, "search": result.to_json()}
    atomic_write_json(path, doc)
    return path


def search_identity(budget: int, seed: int, tokens: int, data: dict[str, Any]) -> dict[str, Any]:
    """meta.json `extend.search` of a searched child: what its factors depend on besides the parent's weights,
    factor and L (recorded apart): the search's settings and the tokens it scored (`search_windows`)."""
    return {"budget": budget, "seed": seed, "tokens": tokens, "data": data}


def _searchable_run(parent_dir: Path, out_dir: Path, ext: ExtendConfig, budget: int, tokens: int) -> LoadedRun:
    """The loaded RoPE run to search on; one-line refusals for anything else (before any search), `out_dir` the
    parent included."""
    if ext.method != "longrope":
        raise ConfigError(f"--search finds LongRoPE factors; use it with --longrope, not --method {ext.method}")
    validate_extend(ext)
    check_search_settings(budget, tokens)
    check_parent(parent_dir, out_dir, search=True)
    run = load_run(parent_dir)
    refuse_dropped(parent_dir, run.positions_dropped_at, "there are no RoPE frequencies to search")
    require_rope(run.config, parent_dir)
    return run


def _with_factors(ext: ExtendConfig, run: LoadedRun, long_factor: Sequence[float]) -> ExtendConfig:
    """`ext` with these long factors and short factors 1 (the model is unchanged up to L)."""
    cfg = run.config
    pairs = rotary_dim(cfg.model.head_dim, cfg.pos.rotary_fraction) // 2  # type: ignore[attr-defined]
    params = replace(ext.params, short_factor=[1.0] * pairs, long_factor=[float(v) for v in long_factor])
    return replace(ext, params=params)


def _earlier_factors(
    out_dir: Path, identity: dict[str, Any], parent_sha: str, scaling: dict[str, Any]
) -> list[float] | None:
    """The long factors of the child already in `out_dir` when it is this same search (settings, scored tokens,
    parent weights, factor and L: the search is deterministic, so they are what a re-run would find); None when
    `out_dir` holds no run yet. Anything else there is refused in one line now, before the search: a run that is
    not an extension, another search (or given factors), other parent weights, factor or L."""
    meta = existing_child(out_dir)
    if meta is None:
        return None
    old = recorded_extension(meta)
    old_scaling = old.get("scaling") if isinstance(old, dict) else None
    if isinstance(old_scaling, dict):  # compare only what the factors depend on; the rest is extend_run's check
        meta = {"extend": {**old, "scaling": {k: old_scaling.get(k) for k in scaling}}}
    record = {"method": "longrope", "parent_weights_sha256": parent_sha, "search": identity, "scaling": scaling}
    check_same_keys(out_dir, meta, record, ("method", "parent_weights_sha256", "scaling", "search"))
    assert isinstance(old_scaling, dict)  # the same search recorded, so a LongRoPE scaling
    return [float(v) for v in old_scaling["params"]["long_factor"]]


def searched_factors(
    parent_dir: Path | str,
    out_dir: Path | str,
    ext: ExtendConfig,
    *,
    budget: int = 16,
    seed: int = 0,
    tokens: int = 8192,
    threads: int = 0,
    progress: Progress | None = None,
) -> tuple[ExtendConfig, SearchResult | None, dict[str, Any]]:
    """(`ext` with the searched factors, the search, its `search_identity`) for `extend_run(..., search=identity)`
    into `out_dir`. When `out_dir` already holds the child of this same search, the search is not re-run: the
    factors are the child's and the search returned is None. Writes nothing; refused with one line for a run that
    is not RoPE (or a transformers directory), a method other than longrope, and an `out_dir` that is the parent or
    holds something else, before any search."""
    with use_threads(threads):
        run = _searchable_run(Path(parent_dir), Path(out_dir), ext, budget, tokens)
        original_length = ext.original_length or parent_train_length(run.config, run.meta)
        check_factor(ext.method, ext.factor, original_length)
        _, data = search_windows(run, round(ext.factor * original_length), tokens)
        identity = search_identity(budget, seed, tokens, data)
        parent_sha, scaling = (
            str(run.meta.files[MODEL_FILE]),
            {"factor": float(ext.factor), "original_length": original_length},
        )
        long_factor = _earlier_factors(Path(out_dir), identity, parent_sha, scaling)
        if long_factor is not None:
            return _with_factors(ext, run, long_factor), None, identity
        result = search_long_factors(
            run, ext.factor, original_length, budget=budget, seed=seed, tokens=tokens, progress=progress
        )
    return _with_factors(ext, run, result.long_factor), result, identity
