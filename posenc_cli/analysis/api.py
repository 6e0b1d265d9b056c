"""posenc as Python functions: train, evaluate, extend, sweep and compare, each returning data.

The commands in `posenc_cli.cli` parse their flags, call these and render what they return; a notebook calls them
directly. They print nothing (a progress display is whatever the caller passes as `callback`/`progress`), raise
`posenc_cli.errors.UserError` subclasses for a user's mistake (a bad value, a missing file, a directory of the wrong
kind), and take the commands' defaults::

    from posenc_cli.analysis import api

    run = api.train(["pos=alibi", "model=tiny", "train.steps=600"], out="runs/alibi")
    api.evaluate([run.run_dir], lengths=[1, 2, 4])
    api.compare([run.run_dir])  # a pandas DataFrame: one row per run, one column per length

Layout follows litgpt's `api.py` beside its `__main__.py` (commands as plain typed functions): the command decides
nothing that this module does not.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from posenc_cli.analysis.compare import (
    METRICS,
    Comparison,
    gather,
    labelled_in_order,
    to_results,
    write_outputs,
)
from posenc_cli.config import Config, EvalConfig, ExtendConfig, build_dataclass, config_to_dict
from posenc_cli.errors import ConfigError, UserError

if TYPE_CHECKING:
    import pandas as pd

    from posenc_cli.analysis.rows import RunRecord
    from posenc_cli.extension.extend import RemapResult
    from posenc_cli.perf.costs import RunCost
    from posenc_cli.perf.profiling import StageClock
    from posenc_cli.positional.remap import RemapConfig
    from posenc_cli.report.reference_tables import ReferenceTable
    from posenc_cli.run.outcome import ExtendResult, TrainResult
    from posenc_cli.sweep.runner import StagePlan, SweepSpec

__all__ = [
    "CompareReport",
    "Comparison",
    "Evaluation",
    "SweepPlan",
    "SweepReport",
    "TextTable",
    "compare",
    "comparison",
    "eval_config",
    "evaluate",
    "extend",
    "plan_sweep",
    "run_planned_sweep",
    "sweep",
    "sweep_report",
    "train",
    "train_config",
    "train_warning",
]

PathLike = str | Path
Event = Callable[[dict[str, Any]], None]

# ----------------------------------------------------------------------------------------------------------------
# train


def train_config(
    overrides: Sequence[str] = (),
    *,
    out: PathLike | None = None,
    resume: PathLike | None = None,
    config_dir: PathLike | None = None,
) -> Config:
    """The config `train` would run: composed from Hydra-style `overrides` (`pos=alibi train.steps=600`), or with
    `resume` the run's saved config with dotted overrides (`train.steps=800`) applied on top."""
    if resume is not None:
        if out is not None and Path(out).resolve() != Path(resume).resolve():
            raise ConfigError("--out and --resume name different directories; give one of them")
        return resumed_config(Path(resume), list(overrides))
    # deferred: Hydra's compose API costs a second of import
    from posenc_cli.sweep.hydra_bridge import compose_config

    return compose_config(list(overrides), Path(config_dir) if config_dir else None)


def resumed_config(run_dir: Path, overrides: list[str]) -> Config:
    """The config saved in `run_dir`, with dotted overrides (train.steps=800) applied on top."""
    # deferred: keeps OmegaConf (Hydra's) off the import of this module
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from posenc_cli.run.config_load import config_from_dict
    from posenc_cli.run.load import read_config
    from posenc_cli.run.meta import read_meta

    for o in overrides:
        key = o.split("=", 1)[0]
        if key.startswith(("+", "~")) or "." not in key:
            raise ConfigError(f"with --resume, overrides must set single keys such as train.steps=800 (got '{o}')")
    cfg = read_config(run_dir, read_meta(run_dir))
    if not overrides:
        return cfg
    try:
        merged = OmegaConf.merge(OmegaConf.create(config_to_dict(cfg)), OmegaConf.from_dotlist(overrides))
        raw = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError(str(e).splitlines()[0]) from e
    assert isinstance(raw, dict)
    return config_from_dict(raw)  # type: ignore[arg-type]


def train_warning(cfg: Config) -> str | None:
    """Refuse a config that cannot run here (`run.train.check_budget`, which `train` checks again), then the
    busy-machine advice for it, if any (`cpu_load.training_busy_warning`; only the main process of a torchrun)."""
    # deferred: torch
    from posenc_cli.cpu_load import training_busy_warning
    from posenc_cli.run.distributed import env_info
    from posenc_cli.run.train import check_budget

    check_budget(cfg)
    busy = training_busy_warning(cfg.train.device, cfg.train.threads)
    return busy if busy and env_info().is_main else None


def train(
    overrides: Sequence[str] | Config = (),
    out: PathLike | None = None,
    *,
    resume: PathLike | None = None,
    force_config: bool = False,
    config_dir: PathLike | None = None,
    callback: Event | None = None,
) -> TrainResult:
    """Train one model into run directory `out` (default outputs/runs/<time>-<pos>-<model>), continuing the run
    already there; `resume`: continue the run in that directory with its saved config (`overrides` then set single
    keys). `overrides` may be a `Config` (`train_config`'s). A changed config is refused unless `force_config`; a
    finished run returns at once (`stopped_reason="already_complete"`); SIGTERM or Ctrl-C during training saves a
    checkpoint and returns `stopped_reason="interrupted"`. `callback` receives every training event (the CLI's
    `run.progress.TrainDisplay`); the configured tracker (train.logger) gets them too."""
    # deferred: torch
    from posenc_cli.run.run_dir import default_run_dir
    from posenc_cli.run.trackers import tracked
    from posenc_cli.run.train import train as run_training

    if isinstance(overrides, Config):
        if resume is not None and out is not None and Path(out).resolve() != Path(resume).resolve():
            raise ConfigError("--out and --resume name different directories; give one of them")
        cfg = overrides
    else:
        cfg = train_config(overrides, out=out, resume=resume, config_dir=config_dir)
    where = resume if resume is not None else out
    run_dir = Path(where) if where else default_run_dir(cfg)
    with tracked(callback, cfg, run_dir) as events:
        return run_training(cfg, run_dir, resume=resume is not None, force_config=force_config, callback=events)


# ----------------------------------------------------------------------------------------------------------------
# evaluate (eval-extrapolate)


def eval_config(
    *,
    lengths: Sequence[float] | None = None,
    abs_lengths: Sequence[int] | None = None,
    protocol: str | None = None,
    stride: int | None = None,
    target: int | None = None,
    window: int | None = None,
    sinks: int | None = None,
    tokens: int | None = None,
    batch_tokens: int | None = None,
    dtype: str | None = None,
    force: bool = False,
) -> EvalConfig:
    """`EvalConfig`'s defaults with the settings given (None: the default), type- and range-checked, and refused
    where they do not go together (a stride without a protocol that has one, and so on)."""
    if lengths is not None and abs_lengths is not None:
        raise ConfigError("give either --lengths (multiples of the base length) or --abs-lengths (tokens), not both")
    raw = dataclasses.asdict(EvalConfig())
    given = {
        "lengths": list(lengths) if lengths is not None else None,
        "abs_lengths": list(abs_lengths) if abs_lengths is not None else None,
        "protocol": protocol,
        "stride": stride,
        "target": target,
        "window": window,
        "sinks": sinks,
        "tokens": tokens,
        "batch_tokens": batch_tokens,
        "dtype": dtype,
    }
    raw.update({k: v for k, v in given.items() if v is not None})
    raw["force"] = force
    cfg = build_dataclass(EvalConfig, raw, "eval")
    cfg.validate()
    if cfg.stride is not None and cfg.protocol not in ("sliding", "streaming"):
        raise ConfigError(
            "--stride applies to --protocol sliding or streaming only (nonoverlap scores every token of a window)"
        )
    if (window is not None or sinks is not None) and cfg.protocol != "streaming":
        raise ConfigError("--window and --sinks apply to --protocol streaming only")
    if cfg.target is not None and cfg.protocol != "fixed-target":
        raise ConfigError("--target applies to --protocol fixed-target only")
    return cfg


@dataclass(frozen=True)
class Evaluation:
    """eval-extrapolate's results: one doc per run (`perplexity.evaluate_run`'s, with "label" and "path"), labelled
    and ordered as `compare` shows them; `by`: the table's columns, "multiple" or "length" (abs lengths)."""

    results: list[dict[str, Any]]
    config: EvalConfig
    by: Literal["multiple", "length"] = "multiple"

    def to_json(self) -> dict[str, Any]:
        """The combined document of `--json`: every run's doc without its bookkeeping ("reused")."""
        return {"schema_version": 1, "runs": [{k: v for k, v in r.items() if k != "reused"} for r in self.results]}

    @property
    def reused(self) -> int:
        """Cells read back from the runs' eval/extrapolate.json rather than measured now."""
        return sum(r["reused"] for r in self.results)

    @property
    def cells(self) -> int:
        return sum(len(r["entries"]) for r in self.results)


def evaluate(
    runs: Sequence[PathLike],
    *,
    config: EvalConfig | None = None,
    lengths: Sequence[float] | None = None,
    abs_lengths: Sequence[int] | None = None,
    tokens: int | None = None,
    protocol: str | None = None,
    data_overrides: Sequence[str] = (),
    positions: str | None = None,
    positions_seed: int = 0,
    train_length: int | None = None,
    device: str = "auto",
    threads: int = 0,
    force: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
    on_run: Callable[[Path, int, int], None] | None = None,
    on_skip: Callable[[Path, str], None] | None = None,
    **options: Any,
) -> Evaluation:
    """Perplexity of every run below `runs` at each length, stored in each run's eval/extrapolate.json (cells
    already stored are reused unless `force`). The settings are `eval_config`'s (`lengths`, `tokens`, `protocol`,
    and `options`: stride, target, window, sinks, batch_tokens, dtype), or a ready `config`. `data_overrides`
    (`data=text data.paths=[FILE]`) score every run on another corpus; `positions`: random or sequential (default:
    what the run trained with); `train_length`: transformers directories' training length. `progress`, `on_run`
    and `on_skip` report as the work goes (a searched run that cannot be read is skipped through `on_skip`)."""
    # deferred: torch
    from posenc_cli.evaluation.perplexity import evaluate_paths
    from posenc_cli.run.device import resolve_device
    from posenc_cli.run.hf_run import train_length_override

    if not runs:
        raise ConfigError("give at least one run directory (or a sweep directory holding runs)")
    given = {"lengths": lengths, "abs_lengths": abs_lengths, "tokens": tokens, "protocol": protocol, **options}
    if config is None:
        config = eval_config(**given, force=force)
    elif any(v is not None for v in given.values()) or force:
        raise ConfigError("give evaluation settings or a config, not both")
    if positions is not None and positions not in ("random", "sequential"):
        raise ConfigError(f"--positions must be random or sequential, got {positions!r}")
    run_device = resolve_device(device, "--device")  # an unavailable device is reported as the flag given
    if train_length is not None and train_length < 2:
        raise ConfigError(f"--train-length must be >= 2, got {train_length}")
    with train_length_override(train_length):
        results = evaluate_paths(
            [str(p) for p in runs],
            config,
            data_overrides=list(data_overrides),
            device=run_device,
            threads=threads,
            progress=progress,
            on_run=on_run,
            on_skip=on_skip,
            positions=positions,
            positions_seed=positions_seed,
        )
    by: Literal["multiple", "length"] = "length" if config.abs_lengths is not None else "multiple"
    return Evaluation(labelled_in_order(results), config, by)  # the labels and order compare shows


# ----------------------------------------------------------------------------------------------------------------
# extend


def extend(
    run: PathLike,
    out: PathLike | None = None,
    *,
    extension: ExtendConfig | None = None,
    remap: RemapConfig | None = None,
    logn: bool | None = None,
    threads: int = 0,
    callback: Event | None = None,
) -> ExtendResult | RemapResult:
    """Extend RoPE run `run` into `out` (default: named after the method beside the run): with `extension` a scaled
    child (`extension.extend.extend_run`: position interpolation, NTK, YaRN, LongRoPE with its factors given, ...,
    fine-tuned when `extension.finetune_steps`; `callback` gets the fine-tune's events), or with `remap` a child
    that remaps positions at inference (`extension.extend.remap_run`; `logn`: query scaling, default the method's
    reference). Idempotent: a child already there is returned as is. LongRoPE's search: `posenc extend --search`
    (`extension.longrope_search.searched_factors`, then `extend_run` with its identity)."""
    # deferred: torch
    from posenc_cli.extension.extend import default_out_dir, extend_run, remap_out_dir, remap_run, validate_extend

    if (extension is None) == (remap is None):
        raise ConfigError("give an extension (a scaling method) or a remap, one of them")
    if remap is not None:
        remap.validate()  # before naming the default directory after the settings
        out_dir = Path(out) if out is not None else remap_out_dir(run, remap, logn)
        return remap_run(run, out_dir, remap, threads=threads, logn=logn)
    assert extension is not None
    validate_extend(extension)  # before naming the default directory after the method
    out_dir = Path(out) if out is not None else default_out_dir(run, extension)
    return extend_run(run, out_dir, extension, threads=threads, callback=callback)


# ----------------------------------------------------------------------------------------------------------------
# compare


@dataclass(frozen=True)
class TextTable:
    """A table of ready text: a paper's numbers beside posenc's (`report.reference_tables.side_by_side`)."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    caption: str


@dataclass
class CompareReport:
    """What `posenc compare` shows: the comparison itself, and the extras asked for: a paper's table beside it
    (`reference`), the NoPE paper's MRR ranking (`mrr`: `analysis.mrr.nope_mrr`), each run's costs (`costs`)."""

    comparison: Comparison
    reference: TextTable | None = None
    mrr: pd.DataFrame | None = None
    costs: list[RunCost] | None = None


REFERENCES = ("nope-mrr",)  # besides `report.reference_tables.REFERENCE_TABLES`


def comparison(
    runs: Sequence[PathLike],
    *,
    metric: str = "ppl",
    baseline: str | None = None,
    all_lengths: bool = False,
    out: PathLike | None = None,
    reference: str | None = None,
    costs: bool = False,
) -> CompareReport:
    """Gather the runs below `runs` (`analysis.compare.gather`) and compare them in `metric` (ppl, bpb, nll or
    longppl), divided by `baseline`'s row (a label or run directory); with `out`, write results.csv/json and the
    plots there (`analysis.compare.write_outputs`). Every refusal comes before anything is written."""
    # deferred: perf and reference tables are only needed when asked for
    from posenc_cli.report.reference_tables import REFERENCE_TABLES, reference_table

    if metric not in METRICS:
        raise UserError(f"--metric must be {', '.join(list(METRICS)[:-1])} or {list(METRICS)[-1]}, got {metric}")
    if out is not None:
        # deferred: only with --out
        from posenc_cli.report.output_files import check_writable_dir

        check_writable_dir(Path(out))  # before anything is gathered or written
    records = gather([Path(p) for p in runs], all_lengths=all_lengths)
    report = CompareReport(Comparison(records, metric=metric, baseline=baseline))
    if reference is not None and reference not in REFERENCES:
        if reference not in REFERENCE_TABLES:
            known = ", ".join([*REFERENCE_TABLES, *REFERENCES])
            raise ConfigError(f"--reference {reference}: unknown table (available: {known})")
        report.reference = reference_view(reference_table(reference), records)
    if reference == "nope-mrr":
        from posenc_cli.analysis.mrr import nope_mrr  # deferred: pandas

        report.mrr = nope_mrr([Path(p) for p in runs])
    if costs:
        from posenc_cli.perf.costs import run_costs  # deferred: only with --costs

        report.costs = run_costs((r.label, r.run_dir) for r in records)
    if out is not None:
        report.comparison.written = write_outputs(records, Path(out))
    return report


def reference_view(table: ReferenceTable, records: list[RunRecord]) -> TextTable:
    """posenc's ppl(m·L)/ppl(L) next to the paper's, one row per run label (`reference_tables.side_by_side`)."""
    # deferred: only with --reference
    from posenc_cli.report.reference_tables import length_notes, side_by_side

    results = to_results(records)
    headers, rows = side_by_side(table, results)
    caption = "\n".join([table.citation, *length_notes(table, results)])
    return TextTable(f"ppl(L') / ppl(L): posenc / paper ({table.name})", headers, rows, caption)


def compare(
    runs: Sequence[PathLike], *, metric: str = "ppl", baseline: str | None = None, all_lengths: bool = False
) -> pd.DataFrame:
    """The comparison table as a DataFrame (`Comparison.to_frame`): index "run" (row labels), column "n", then the
    mean `metric` per length and the ratio column; NaN where the table shows n/a, n/m or –."""
    return comparison(runs, metric=metric, baseline=baseline, all_lengths=all_lengths).comparison.to_frame()


# ----------------------------------------------------------------------------------------------------------------
# sweep

LOCAL_LAUNCHERS = ("basic", "joblib", "submitit_local")  # jobs run on this machine, so its load matters


@dataclass
class SweepPlan:
    """A sweep file planned with the user's overrides: its stages' jobs (`plans`), where it will run (`sweep_dir`)
    and on which Hydra launcher (`launcher_name`, with the settings given)."""

    name: str
    spec: SweepSpec
    overrides: list[str]  # the jobs' (everything but hydra...)
    launcher_overrides: list[str]
    plans: list[StagePlan]
    sweep_dir: Path
    launcher_name: str
    launcher_given: dict[str, Any]
    user_dir: Path | None

    @property
    def jobs(self) -> int:
        return sum(len(p.jobs) for p in self.plans)

    def busy_warning(self) -> str | None:
        """The busy-machine advice for the jobs when they run on this machine (`LOCAL_LAUNCHERS`): the first job's
        threads as posenc would give them, times the launcher's n_jobs."""
        if self.launcher_name not in LOCAL_LAUNCHERS:
            return None
        # deferred: Hydra
        from posenc_cli.cpu_load import training_busy_warning
        from posenc_cli.sweep.hydra_bridge import compose_config

        first = next((job for plan in self.plans for job in plan.jobs), None)
        if first is None:
            return None
        train_cfg = compose_config(first.overrides, self.user_dir).train
        n_jobs = self.launcher_given.get("n_jobs")
        jobs = int(n_jobs) if isinstance(n_jobs, int) and n_jobs > 0 else 1
        return training_busy_warning(train_cfg.device, train_cfg.threads, jobs)


def plan_sweep(
    name: str = "extrapolation",
    overrides: Sequence[str] = (),
    out: PathLike | None = None,
    *,
    config_dir: PathLike | None = None,
    check: bool = False,
) -> SweepPlan:
    """Plan sweep file `name` (configs/sweep/NAME.yaml, or in `config_dir`) with `overrides` (`hydra...` ones go to
    the launcher, checked here as the launch checks them). `check`: also compose and validate every job, and refuse
    a job in `out` planned with another config, as running it would (the dry run). Runs nothing."""
    # deferred: Hydra
    from posenc_cli.config import config_dir as packaged_config_dir
    from posenc_cli.sweep.hydra_bridge import launcher_settings
    from posenc_cli.sweep.runner import (
        check_planned,
        find_sweep_file,
        load_sweep_spec,
        plan_identities,
        validate_plan,
    )
    from posenc_cli.sweep.runner import plan_sweep as plan_stages

    user_dir = Path(config_dir) if config_dir else None
    launcher = [o for o in overrides if o.lstrip("+~").startswith("hydra")]
    task = [o for o in overrides if o not in launcher]
    roots = [p for p in (user_dir, packaged_config_dir()) if p is not None]
    spec = load_sweep_spec(find_sweep_file(name, roots))
    launcher_name, launcher_given = launcher_settings(launcher, user_dir)  # as the launch itself would check
    plans = plan_stages(spec, task)
    if check:
        configs = validate_plan(plans, user_dir)
        if out is not None and Path(out).is_dir():  # a job there planned with another config is refused
            check_planned(Path(out).resolve(), plans, plan_identities(plans, configs))
    sweep_dir = Path(out) if out is not None else default_sweep_dir(spec.name)
    return SweepPlan(name, spec, task, launcher, plans, sweep_dir, launcher_name, launcher_given, user_dir)


def default_sweep_dir(name: str) -> Path:
    return Path("outputs") / "sweeps" / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"


@dataclass
class SweepRun:
    """A sweep that ran: its plan, the stage clock (`perf.profiling.StageClock`) and its wall time."""

    plan: SweepPlan
    clock: StageClock
    seconds: float


def run_planned_sweep(plan: SweepPlan, *, on_event: Callable[[str, str], None] | None = None) -> SweepRun:
    """Run `plan`'s stages through Hydra's multirun (`sweep.runner.run_sweep`; done jobs are skipped, others
    resume). `on_event(kind, text)` hears each stage start or skip. A job stopped by a signal raises
    `sweep.runner.SweepInterrupted`; the same call resumes it."""
    # deferred: Hydra, torch
    from posenc_cli.perf.profiling import StageClock
    from posenc_cli.sweep.runner import run_sweep

    start = time.perf_counter()
    clock = StageClock(on_event)
    # run_sweep plans the stages again from the spec (the same plan: `plan_sweep` is deterministic)
    plan.plans = run_sweep(
        plan.spec,
        plan.overrides,
        plan.sweep_dir,
        launcher_overrides=plan.launcher_overrides,
        user_config_dir=plan.user_dir,
        on_event=clock,
    )
    clock.finish()
    return SweepRun(plan, clock, time.perf_counter() - start)


@dataclass
class SweepReport:
    """A finished sweep's outputs: the comparison of its runs (results.csv/json and plots written in the sweep
    directory), the attention figure when asked, profile.json's document, the failed jobs and the planned jobs
    without results (`unfinished`)."""

    sweep_dir: Path
    comparison: Comparison
    failed: int
    unfinished: list[RunRecord]
    profile: dict[str, Any]
    attention: Path | None = None


def sweep_report(
    ran: SweepRun, *, viz: bool = False, profile: bool = False, startup_s: float | None = None
) -> SweepReport:
    """Compare the sweep's runs into its directory (`analysis.compare.write_outputs`), draw their attention
    panels (`viz`: attention.png), and write profile.json (`profile`: with the matmul peak measured)."""
    # deferred: matplotlib, torch
    from posenc_cli.perf.profiling import write_sweep_profile

    report_start = time.perf_counter()
    sweep_dir = ran.plan.sweep_dir
    records = gather([sweep_dir])
    comp = Comparison(records)
    comp.written = write_outputs(records, sweep_dir)
    attention = None
    if viz:
        # deferred: matplotlib
        from posenc_cli.analysis.viz import write_attention_comparison

        done = [r.run_dir for r in records if r.status == "ok"]
        if done:
            attention = write_attention_comparison(done, Path(sweep_dir) / "attention.png")
    parent = {"start-up": startup_s or 0.0, "report": time.perf_counter() - report_start}
    doc = write_sweep_profile(sweep_dir, ran.plan.plans, ran.clock, parent, measure_peak=profile)
    planned = {job.dir(Path(sweep_dir)).resolve() for plan in ran.plan.plans for job in plan.jobs}
    unfinished = [r for r in records if r.status != "ok" and Path(r.run_dir).resolve() in planned]
    failed = sum(r.status == "failed" for r in records)
    return SweepReport(sweep_dir, comp, failed, unfinished, doc, attention)


def sweep(
    name: str = "extrapolation",
    overrides: Sequence[str] = (),
    out: PathLike | None = None,
    *,
    config_dir: PathLike | None = None,
    on_event: Callable[[str, str], None] | None = None,
    viz: bool = False,
    profile: bool = False,
) -> SweepReport:
    """Plan, run and compare sweep file `name` into `out` (default outputs/sweeps/<time>-<name>; re-use it to
    resume): `plan_sweep`, `run_planned_sweep`, `sweep_report`."""
    return sweep_report(
        run_planned_sweep(plan_sweep(name, overrides, out, config_dir=config_dir), on_event=on_event),
        viz=viz,
        profile=profile,
    )
