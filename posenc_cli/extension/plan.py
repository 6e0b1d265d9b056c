"""One plan for an extension: a request becomes `Scale`, `Remap` or `SearchThenScale`, and `execute` does it.

`posenc extend` (its flags as an `ExtendRequest`: `plan_extension`) and a sweep's extend job (its validated
`ExtendConfig`: `plan_from_config`) check what they were given in their own terms, then both hand the settings to
one planner (`_plan`), which chooses among the three plans; all run through the one `execute`, so the rules of what
an extension is are written once:

- `Scale`: frequency scaling of a RoPE run (`extend.extend_run`), with an optional fine-tune. LongRoPE needs its
  factors here (given in `--factors FILE` or as `params.long_factor`).
- `Remap`: a training-free position remapping (Self-Extend, ReRoPE: `extend.remap_run`), no scaling, no fine-tune.
- `SearchThenScale`: LongRoPE's evolutionary search for the long factors on the parent
  (`longrope_search.searched_factors`), then `Scale` with them; `execute` writes `longrope_factors.json` into the
  child (`longrope_search.FACTORS_FILE`) after a search run now. A child of this same search already in the output
  directory is recognised before the search, which is then not run again.

Every refusal is a one-line `UserError` raised while planning (bad flag combinations, unknown method, LongRoPE
without factors, remap settings missing) or by the steps `execute` runs (the parent, the output directory), before
anything is written. Planning reads nothing but a `--factors` file and imports no torch (a remapping's settings are
`config.RemapConfig`), and `execute` checks the parent (`extension.settings`) before it imports the code that loads
a checkpoint: every refusal that needs no checkpoint comes before torch.

Python use (what `posenc extend RUN --yarn --factor 4 --finetune-steps 60` does):

    plan = plan_extension(ExtendRequest(run=Path("outputs/runs/rope"), method="yarn", factor=4.0, finetune_steps=60))
    outcome = execute(plan)   # outcome.result: ExtendResult (or RemapResult for a Remap), outcome.search, ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc_cli.config import REMAP_METHODS, ExtendConfig, RemapConfig, replace
from posenc_cli.errors import ConfigError
from posenc_cli.extension.settings import (
    check_parent,
    check_search_settings,
    default_out_dir,
    finetune_length,
    remap_out_dir,
    validate_extend,
)
from posenc_cli.rope_scaling import ScalingParams, get_method, make_params, method_names, param_fields

if TYPE_CHECKING:
    from posenc_cli.extension.longrope_search import Progress, SearchResult
    from posenc_cli.extension.remap import RemapResult
    from posenc_cli.run.outcome import ExtendResult

__all__ = [
    "SEARCH_DEFAULTS",
    "ExtendOutcome",
    "ExtendRequest",
    "Plan",
    "Remap",
    "Scale",
    "SearchThenScale",
    "execute",
    "one_method",
    "plan_extension",
    "plan_from_config",
]

_D = ExtendConfig()  # the defaults of every scaling and fine-tune setting (configs/extend/default.yaml)
SEARCH_DEFAULTS = {"budget": 16, "seed": 0, "tokens": 8192}  # `extend --search`'s (budget: candidates scored)


# ----------------------------------------------------------------------------------------------------------------
# The plans.


@dataclass(frozen=True, kw_only=True)
class Scale:
    """Scale RoPE run `run`'s frequencies as `ext` says into `out` (fine-tuned when `ext.finetune_steps`)."""

    run: Path
    out: Path
    ext: ExtendConfig
    threads: int = 0

    def __post_init__(self) -> None:
        validate_extend(self.ext)
        p = self.ext.params
        if self.ext.method == "longrope" and p.long_factor is None and p.short_factor is None:  # type: ignore[attr-defined]
            raise ConfigError("LongRoPE needs its factors: --factors FILE, --search, or --long-factor (d/2 times)")


@dataclass(frozen=True, kw_only=True)
class Remap:
    """Remap run `run`'s positions as `remap` says into `out`; `logn`: log-n query scaling (None: as the method's
    reference, `settings.remap_logn_default`)."""

    run: Path
    out: Path
    remap: RemapConfig
    logn: bool | None = None
    threads: int = 0
    layers: str = _D.layers

    def __post_init__(self) -> None:
        if self.remap.method not in REMAP_METHODS:
            raise ConfigError(f"give a remapping method: {' or '.join(REMAP_METHODS)}")
        self.remap.validate()


@dataclass(frozen=True, kw_only=True)
class SearchThenScale:
    """Search LongRoPE's long factors on `run` (`budget` candidates, `seed`, `tokens` training-split tokens each),
    then scale with them into `out` as `Scale` does (`ext` holds no factors; the search supplies them)."""

    run: Path
    out: Path
    ext: ExtendConfig
    budget: int = SEARCH_DEFAULTS["budget"]
    seed: int = SEARCH_DEFAULTS["seed"]
    tokens: int = SEARCH_DEFAULTS["tokens"]
    threads: int = 0

    def __post_init__(self) -> None:
        if self.ext.method != "longrope":
            raise ConfigError(
                f"--search finds LongRoPE factors; use it with --longrope, not --method {self.ext.method}"
            )
        validate_extend(self.ext)
        check_search_settings(self.budget, self.tokens)


Plan = Scale | Remap | SearchThenScale


@dataclass
class ExtendOutcome:
    """What `execute` did: the child's result, and for `SearchThenScale` the search run now (None: the child of this
    same search was already there, so it was not run again) and the factors file written. `evaluation`: parent and
    child measured side by side, when the caller asked (`api.extend(evaluate=True)`)."""

    plan: Plan
    result: ExtendResult | RemapResult
    search: SearchResult | None = None
    factors_file: Path | None = None
    evaluation: list[dict[str, Any]] | None = None

    @property
    def interrupted(self) -> bool:
        return self.result.status == "interrupted"

    @property
    def remapped(self) -> bool:
        return isinstance(self.plan, Remap)

    @property
    def pose_span(self) -> int | None:
        """A PoSE fine-tune: the span of position ids its windows covered (`extend.finetune_length`); else None."""
        if isinstance(self.plan, Remap) or not self.plan.ext.pose:
            return None
        return finetune_length(self.plan.ext, self.result.original_length)  # type: ignore[union-attr]


# ----------------------------------------------------------------------------------------------------------------
# Requests: `posenc extend`'s flags as data.


@dataclass(frozen=True, kw_only=True)
class ExtendRequest:
    """An extension as `posenc extend` asks for it. `method`: a scaling method (`posenc_cli/rope_scaling/`),
    self-extend or rerope; None: yarn, or longrope when `factors` or `search` is given. `params`: the scaling
    method's own parameters that were given (by name: beta_fast, long_factor, ...). `window`, `group`, `leaky`:
    the remapping's (None: not given). `logn`: log-n on top (None: off for a scaling, the method's reference for a
    remapping). The other fields are `ExtendConfig`'s and `extend --search`'s, with their defaults."""

    run: Path
    out: Path | None = None
    method: str | None = None
    factor: float = _D.factor
    original_length: int | None = _D.original_length
    params: Mapping[str, Any] = field(default_factory=dict)
    finetune_steps: int = _D.finetune_steps
    finetune_seq_len: int | None = _D.finetune_seq_len
    finetune_lr: float = _D.finetune_lr
    finetune_warmup: int = _D.finetune_warmup
    pose: bool = _D.pose
    pose_chunks: int = _D.pose_chunks
    logn: bool | None = None
    factors: Path | None = None
    search: bool = False
    search_budget: int = SEARCH_DEFAULTS["budget"]
    search_seed: int = SEARCH_DEFAULTS["seed"]
    search_tokens: int = SEARCH_DEFAULTS["tokens"]
    window: int | None = None
    group: int | None = None
    leaky: float | None = None
    threads: int = 0
    layers: str = _D.layers  # a per-layer layout: its global RoPE layers, or all (`extension.rope_layers`)


def one_method(named: Sequence[str]) -> str | None:
    """The one method among those the command line named (`--method` and the `--<method>` shorthands); None when
    none was; one line when several differ."""
    if len(set(named)) > 1:
        what = "method" if any(m in REMAP_METHODS for m in named) else "scaling method"
        raise ConfigError(f"give one {what}, got {', '.join(named)}")
    return named[0] if named else None


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def plan_extension(req: ExtendRequest) -> Plan:
    """The plan for `req`, or a one-line `ConfigError` for flags that do not fit together (checked in the order
    `posenc extend` has always checked them). Reads the `--factors` file, nothing else; imports no torch."""
    if req.method in REMAP_METHODS:
        return _plan_remap(req)
    if given := [flag for flag in ("window", "group", "leaky") if getattr(req, flag) is not None]:
        raise ConfigError(f"{_flag(given[0])} belongs to --method self-extend or rerope")
    method = req.method if req.method is not None else ("longrope" if req.factors or req.search else _D.method)
    ext = ExtendConfig(
        method=method,
        factor=req.factor,
        original_length=req.original_length,
        params=_method_params(method, req.params),
        finetune_steps=req.finetune_steps,
        finetune_seq_len=req.finetune_seq_len,
        finetune_lr=req.finetune_lr,
        finetune_warmup=req.finetune_warmup,
        pose=req.pose,
        pose_chunks=req.pose_chunks,
        logn=bool(req.logn),
        layers=req.layers,  # type: ignore[arg-type]  # checked by validate_extend
    )
    ext = _longrope_factors(ext, req.factors, req.search)
    validate_extend(ext)  # before naming the default directory after the method
    out = req.out if req.out is not None else default_out_dir(req.run, ext)
    search = _Search(req.search_budget, req.search_seed, req.search_tokens) if req.search else None
    return _plan(req.run, out, ext, search=search, threads=req.threads)


def _plan_remap(req: ExtendRequest) -> Plan:
    """Self-Extend / ReRoPE: none of the scaling, fine-tune or LongRoPE options, and the remapping's own."""
    method, fields = str(req.method), param_fields()
    given = {
        "factor": req.factor != _D.factor,
        "original_length": req.original_length is not None,
        "finetune_steps": req.finetune_steps != _D.finetune_steps,
        "pose": req.pose,
        "factors": req.factors is not None,
        "search": req.search,
        **{name: name not in fields or value != fields[name].default for name, value in req.params.items()},
    }
    if wrong := [name for name, on in given.items() if on]:
        raise ConfigError(
            f"{_flag(wrong[0])} does not apply to --method {method} (a remapping at inference, no scaling)"
        )
    if req.window is None:
        raise ConfigError(f"--method {method} needs --window W")
    if method == "self-extend" and req.group is None:
        raise ConfigError("--method self-extend needs --group G")
    if method == "self-extend" and req.leaky is not None:
        raise ConfigError("--leaky belongs to --method rerope")
    if method == "rerope" and req.group is not None:
        raise ConfigError("--group belongs to --method self-extend")
    remap = RemapConfig(method=method, window=req.window, group=req.group or 0, leaky=req.leaky or 0.0)
    remap.validate()  # before naming the default directory after the settings
    out = req.out if req.out is not None else remap_out_dir(req.run, remap, req.logn)
    ext = replace(_D, layers=req.layers)  # a remapping reads only the layers of the scaling settings
    return _plan(req.run, out, ext, remap=remap, remap_logn=req.logn, threads=req.threads)


def _method_params(method: str, given: Mapping[str, Any]) -> ScalingParams:
    """`method`'s typed parameters with those `given` (by name); one line for a parameter of another method (each
    method reads only its own) and for an unknown method."""
    if method not in method_names():
        raise ConfigError(f"unknown scaling method '{method}' (available: {', '.join(method_names())})")
    spec, fields = get_method(method), param_fields()
    for name in given:
        if name not in fields:
            raise ConfigError(f"unknown RoPE scaling parameter '{name}'")
        if method not in fields[name].methods:
            owners = " or ".join(f"{get_method(m).title} (--{m})" for m in fields[name].methods)
            raise ConfigError(f"{_flag(name)} belongs to {owners}, not --method {method}")
    return make_params(spec, dict(given))


def _longrope_factors(ext: ExtendConfig, factors: Path | None, search: bool) -> ExtendConfig:
    """`ext` with the factors of `--factors FILE`; one line for LongRoPE options given to another method, for two
    sources of factors, and for LongRoPE without factors."""
    # deferred: the factors reader is needed only with --factors
    from posenc_cli.rope_scaling.longrope import FACTOR_KEYS, read_factors_file

    flags = [k for k in FACTOR_KEYS if getattr(ext.params, k, None) is not None]
    given = [*(["--factors"] if factors is not None else []), *(["--search"] if search else [])]
    given += [_flag(k) for k in flags]
    if ext.method != "longrope":
        if given:
            raise ConfigError(f"{given[0]} belongs to LongRoPE (--longrope), not --method {ext.method}")
        return ext
    if factors is not None and search:
        raise ConfigError("give --factors FILE or --search, not both")
    if (factors is not None or search) and flags:
        raise ConfigError(f"give the factors once: {given[0]} or {_flag(flags[0])}")
    if not given:
        raise ConfigError("LongRoPE needs its factors: --factors FILE, --search, or --long-factor (d/2 times)")
    if factors is None:
        return ext
    return replace(ext, params=replace(ext.params, **read_factors_file(factors)))


def plan_from_config(ext: ExtendConfig, run: Path | str, out: Path | str, *, threads: int = 0) -> Plan:
    """The plan of a sweep's extend job: its `extend` group (validated with the job's config) into `out`.

    `extend.remap` chooses a remapping (`extend.remap_window/group/leaky`, log-n `extend.remap_logn`, the layers
    of `extend.layers`), `extend.longrope_search: N` a search of N candidates (seed `extend.longrope_search_seed`,
    `SEARCH_DEFAULTS`' tokens); otherwise a scaling. `ext` is kept whole in the child's config, as the sweep planned
    it."""
    remap = None
    if ext.remap != "none":
        remap = RemapConfig(method=ext.remap, window=ext.remap_window, group=ext.remap_group, leaky=ext.remap_leaky)
    search = None
    if ext.longrope_search:
        search = _Search(ext.longrope_search, ext.longrope_search_seed, SEARCH_DEFAULTS["tokens"])
    return _plan(Path(run), Path(out), ext, remap=remap, remap_logn=ext.remap_logn, search=search, threads=threads)


@dataclass(frozen=True)
class _Search:
    """LongRoPE's search settings: candidates scored, seed, training-split tokens per candidate."""

    budget: int
    seed: int
    tokens: int


def _plan(
    run: Path,
    out: Path,
    ext: ExtendConfig,
    *,
    remap: RemapConfig | None = None,
    remap_logn: bool | None = None,
    search: _Search | None = None,
    threads: int = 0,
) -> Plan:
    """The one planner: a remapping when `remap` is given (on `ext.layers`), a search then scaling when `search`
    is, a scaling otherwise. Both front ends (`plan_extension`, `plan_from_config`) end here, so a setting reaches
    the plan the same way whichever asked."""
    if remap is not None:
        return Remap(run=run, out=out, remap=remap, logn=remap_logn, threads=threads, layers=ext.layers)
    if search is not None:
        return SearchThenScale(
            run=run, out=out, ext=ext, budget=search.budget, seed=search.seed, tokens=search.tokens, threads=threads
        )
    return Scale(run=run, out=out, ext=ext, threads=threads)


# ----------------------------------------------------------------------------------------------------------------
# Doing it.


def execute(
    plan: Plan,
    *,
    callback: Callable[[dict[str, Any]], None] | None = None,
    progress: Progress | None = None,
    resume: bool = False,
) -> ExtendOutcome:
    """Carry out `plan`: write the child run into `plan.out` (idempotent: a complete child of the same extension is
    reported "already_complete", an interrupted fine-tune resumed). `callback` receives the fine-tune's `train()`
    events, `progress(done, budget, best_ppl)` the search's. `resume=True` requires `plan.out` to hold the extension
    already (scalings only). Prints nothing.

    The parent is checked first (`settings.check_parent`: it exists, is a transformers directory or a posenc run
    that finished training, and is not `plan.out`), before the code that loads it (and torch) is imported."""
    remap, logn = (plan.remap.method, False) if isinstance(plan, Remap) else (None, plan.ext.logn)
    check_parent(plan.run, plan.out, remap=remap, search=isinstance(plan, SearchThenScale), logn=logn)
    # deferred: torch, once the refusals that need none are made
    from posenc_cli.extension.extend import extend_run
    from posenc_cli.extension.longrope_search import searched_factors, write_factors
    from posenc_cli.extension.remap import remap_run

    if isinstance(plan, Remap):
        outcome = remap_run(plan.run, plan.out, plan.remap, threads=plan.threads, logn=plan.logn, layers=plan.layers)
        return ExtendOutcome(plan, outcome)
    if isinstance(plan, Scale):
        result = extend_run(plan.run, plan.out, plan.ext, threads=plan.threads, callback=callback, resume=resume)
        return ExtendOutcome(plan, result)
    ext, found, identity = searched_factors(
        plan.run, plan.out, plan.ext, budget=plan.budget, seed=plan.seed, tokens=plan.tokens, threads=plan.threads,
        progress=progress,
    )  # fmt: skip
    result = extend_run(
        plan.run, plan.out, ext, threads=plan.threads, callback=callback, resume=resume, search=identity
    )
    outcome = ExtendOutcome(dataclasses.replace(plan, ext=ext), result, search=found)
    if found is not None and result.status != "interrupted":
        short = ext.params.short_factor  # type: ignore[attr-defined]
        assert short is not None
        outcome.factors_file = write_factors(result.out_dir, short, found)
    return outcome
