"""Gather evaluation results from run and sweep directories on disk: one `rows.RunRecord` per run (or failed job).

Everything is read from disk (`eval/extrapolate.json` per run, `sweep.json` per sweep), so a comparison works the same
whether the jobs ran here, in parallel processes or on a cluster.

A run has one label wherever it is shown: a sweep's job keeps its plan label (and the plan's order) whether it is
reached through the sweep directory, a stage directory below it, or the run directory itself; any other run below a
sweep is named by its path in the sweep (`train/pos=rope-yarnx8`). A sweep's table has the sweep's own lengths
(`eval.lengths` of its jobs): a length evaluated later for some run only shows with `all_lengths`. Only cells of
the run's current checkpoint are kept, and none of an incomplete run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc_cli.analysis.rows import ANSWER_ONLY, RunRecord, labelled_series, run_identity, run_tokenizer
from posenc_cli.errors import CheckpointError, UserError
from posenc_cli.evaluation.results import checkpoint_identity, checkpoint_key, load_results
from posenc_cli.evaluation.runs import find_runs
from posenc_cli.report.tables import run_label
from posenc_cli.run.hf_run import weights_identity
from posenc_cli.run.load import read_config
from posenc_cli.run.meta import RunMeta, incomplete_reason, is_hf_dir, read_meta, read_run_meta
from posenc_cli.sweep.markers import job_status, read_failure
from posenc_cli.sweep.plan import read_plan

__all__ = [
    "RunName",
    "answer_only",
    "current_checkpoint",
    "enclosing_sweep",
    "gather",
    "labelled_in_order",
    "run_names",
    "shown_label",
    "sweep_lengths",
]


def gather(paths: list[Path], *, all_lengths: bool = False) -> list[RunRecord]:
    """Records for every run under `paths`: a sweep directory's planned jobs under their plan's labels, then any other
    run found below it (an `extend` output, the jobs of an earlier sweep into the same directory) under its path
    relative to the sweep; other runs under `run_names`. Runs below a sweep keep only the sweep's lengths unless
    `all_lengths`."""
    records: list[RunRecord] = []
    for path in map(Path, paths):
        if not path.exists():
            raise UserError(f"{path} does not exist")
        plan = read_plan(path)
        if plan is None:
            runs = find_runs([path])
            if not runs:
                raise UserError(f"{path} holds no posenc run or sweep directory")
            named = sorted(zip(runs, run_names(runs), strict=True), key=lambda pair: pair[1].order)
            records += _named_records(
                [(run, name, None if all_lengths else _sweep_lengths_of(run)) for run, name in named]
            )
            continue
        keep = None if all_lengths else sweep_lengths(path, plan)
        for job in plan["jobs"]:
            job_dir = path / job["dir"]
            status = job_status(job_dir)
            record = RunRecord(label=job["label"], run_dir=job_dir, stage=job["stage"], job=job["name"])
            if status == "failed":
                record.status, record.error = "failed", read_failure(job_dir)
            elif status != "done":
                record.status, record.error = "missing", "no results (not run yet, or interrupted)"
            else:
                _fill(record, keep)
            records.append(record)
        planned = {(path / job["dir"]).resolve() for job in plan["jobs"]}
        others = [run for run in _runs_below(path) if run.resolve() not in planned]
        records += _named_records([(run, RunName(run.relative_to(path).as_posix(), False, ()), keep) for run in others])
    return records


def _named_records(runs: list[tuple[Path, RunName, set[tuple[str, float]] | None]]) -> list[RunRecord]:
    """The records of runs found outside a sweep's plan, (run, its name, the lengths to keep), with the seeds named
    by their directories labelled alike (`name_seeds_alike`)."""
    found = [(_run_record(run, name, keep), name) for run, name, keep in runs]
    name_seeds_alike(found)
    return [record for record, _ in found]


def without_seed(name: str, seed: int | None) -> str | None:
    """`name` less a last part naming the run's own `seed` ('rope-s1', 'rope_seed1', 'pos=rope,train.seed=1' ->
    'rope', 'rope', 'pos=rope'); None when it names no seed, or another one."""
    if seed is None:
        return None
    found = re.fullmatch(rf"(.+?)[,_\-. ]+(?:train\.)?(?:seed|s)[=_\-]?{seed}", name)
    return found.group(1) if found else None


def name_seeds_alike(found: list[tuple[RunRecord, RunName]]) -> None:
    """Give the seeds of one experiment found as directories named by their seed ('rope-s0', 'rope-s1') one label,
    their name without the seed, so that tables average them (`rows.seed_clusters`: one label, one config but for
    the seed). Only runs whose saved configs are equal but for distinct seeds are renamed, and only in twos or more;
    a sweep job keeps its plan label."""
    groups: dict[tuple[str, str], list[tuple[RunRecord, RunName]]] = {}
    for record, name in found:
        base = None if name.planned else without_seed(name.name, record.seed)
        if base is not None and record.identity is not None and record.status != "failed":
            groups.setdefault((base, record.identity), []).append((record, name))
    for (base, _), members in groups.items():
        if len(members) > 1 and len({r.seed for r, _ in members}) == len(members):
            for record, name in members:
                record.label = shown_label(RunName(base, name.planned, name.order), record.scheme)


def enclosing_sweep(run: Path) -> tuple[Path, dict[str, Any]] | None:
    """The sweep directory (and its plan) that holds `run`, if any."""
    for parent in Path(run).resolve().parents:
        plan = read_plan(parent)
        if plan is not None:
            return parent, plan
    return None


@dataclass(frozen=True)
class RunName:
    """How a run is named in tables: `name`, shown as is for a sweep job (`planned`), and its place in the order."""

    name: str
    planned: bool
    order: tuple[Any, ...]


def run_names(runs: list[Path]) -> list[RunName]:
    """A sweep job is named by its plan label, in the plan's order; another run below a sweep by its path in the
    sweep, after the jobs; any other run by its directory name, in the given order."""
    out: list[RunName] = []
    for i, run in enumerate(runs):
        found = enclosing_sweep(run)
        if found is None:
            out.append(RunName(run.name, False, (1, "", 0, i)))
            continue
        sweep_dir, plan = found
        rel = Path(run).resolve().relative_to(sweep_dir).as_posix()
        index = next((j for j, job in enumerate(plan["jobs"]) if job["dir"] == rel), None)
        if index is None:
            out.append(RunName(rel, False, (0, str(sweep_dir), len(plan["jobs"]), i)))
        else:
            out.append(RunName(plan["jobs"][index]["label"], True, (0, str(sweep_dir), index, i)))
    return out


def shown_label(name: RunName, scheme: str) -> str:
    """A plan label as is; any other name with its scheme unless it says it (`report.run_label`)."""
    return name.name if name.planned else run_label({"run": name.name, "scheme": scheme})


def labelled_in_order(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """eval-extrapolate results (each with its "path") labelled and ordered as `compare` shows them, by compare's
    one rule (`rows.labelled_series`): results share a label, and so a table row averaged as mean ± std, only when
    they are the seeds of one experiment measured alike; a run and its export, or two experiments in directories of
    one name, are told apart by their paths (and the setting parts that vary, as compare names them)."""
    names = run_names([Path(r["path"]) for r in results])
    order = sorted(range(len(results)), key=lambda i: names[i].order)
    records = [_result_record(results[i], names[i]) for i in order]
    label_of: dict[int, str] = {}
    for s in labelled_series(records):
        label_of.setdefault(id(s.record), s.label)  # one setting per evaluation result
    return [
        {**results[i], "label": label_of.get(id(rec), rec.label), "tokenizer": _tokenizer_doc(rec)}
        for i, rec in zip(order, records, strict=True)
    ]


def _tokenizer_doc(record: RunRecord) -> dict[str, str] | None:
    """{"fingerprint", "name"} of the run's tokenizer (`rows.run_tokenizer`), None when unknown: tables of runs with
    different tokenizers show bits per byte (`report.tables.extrapolation_table`)."""
    return {"fingerprint": record.tokenizer, "name": record.tokenizer_name} if record.tokenizer else None


def _result_record(result: dict[str, Any], name: RunName) -> RunRecord:
    """An evaluation result as the record `compare` would gather for it: its entries and the run's identity."""
    identity, seed, fingerprint = run_identity(Path(result["path"]))
    tokenizer, tokenizer_name = run_tokenizer(Path(result["path"]))
    return RunRecord(
        label=shown_label(name, str(result["scheme"])),
        run_dir=Path(result["path"]),
        scheme=str(result["scheme"]),
        train_length=result.get("train_length"),
        base_length=result.get("base_length"),
        entries=list(result.get("entries") or []),
        identity=identity,
        seed=seed,
        train_fingerprint=fingerprint,
        tokenizer=tokenizer,
        tokenizer_name=tokenizer_name,
    )


def _sweep_lengths_of(run: Path) -> set[tuple[str, float]] | None:
    found = enclosing_sweep(run)
    return sweep_lengths(*found) if found is not None else None


def sweep_lengths(sweep_dir: Path, plan: dict[str, Any]) -> set[tuple[str, float]] | None:
    """The lengths a sweep's jobs were configured to evaluate ({("multiple", 1.0), ...} or ("length", 512)), from
    each finished job's saved config; None when none can be read (then nothing is filtered)."""
    keys: set[tuple[str, float]] = set()
    for job in plan["jobs"]:
        try:
            ev = read_config(sweep_dir / job["dir"], read_meta(sweep_dir / job["dir"])).eval
        except UserError:
            continue
        if ev.abs_lengths is not None:
            keys.update(("length", float(n)) for n in ev.abs_lengths)
        else:
            keys.update(("multiple", round(float(m), 6)) for m in ev.lengths)
    return keys or None


def _in_lengths(entry: dict[str, Any], keep: set[tuple[str, float]]) -> bool:
    return ("multiple", round(float(entry["multiple"]), 6)) in keep or ("length", float(entry["length"])) in keep


def _runs_below(path: Path) -> list[Path]:
    """Run directories below a sweep directory (none is fine: its jobs may not have started)."""
    try:
        return find_runs([path])
    except CheckpointError:
        return []


def _run_record(run: Path, name: RunName, keep: set[tuple[str, float]] | None = None) -> RunRecord:
    """A run found on disk (not through a sweep's plan), labelled by `shown_label`."""
    record = RunRecord(label=name.name, run_dir=run)
    _fill(record, keep)
    record.label = shown_label(name, record.scheme)
    return record


def current_checkpoint(run_dir: Path) -> tuple[Any, Any]:
    """(step, weights sha256) of the run as it is on disk now (`results.checkpoint_key`): what a stored cell
    must have measured to be shown. A transformers directory is step 0 with `hf_run.weights_identity`."""
    if is_hf_dir(run_dir):
        meta = RunMeta(step=0, files={"model.safetensors": weights_identity(Path(run_dir))})
    else:
        meta = read_run_meta(run_dir)
    return checkpoint_key({"checkpoint": checkpoint_identity(meta)})


def answer_only(run_dir: Path) -> bool:
    """Whether the run trained on answer tokens only (`train.loss_on=answer`); False for a transformers directory
    or a config that cannot be read (its stored cells decide)."""
    if is_hf_dir(run_dir):
        return False
    try:
        return read_config(run_dir, read_meta(run_dir)).train.loss_on == "answer"
    except UserError:
        return False


def _fill(record: RunRecord, keep: set[tuple[str, float]] | None = None) -> None:
    """The run's stored entries of its current checkpoint (cells of an earlier one, or of none recorded, are not
    measured), within `keep`'s lengths."""
    doc = load_results(record.run_dir, missing_ok=True)
    record.identity, record.seed, record.train_fingerprint = run_identity(record.run_dir)  # with cells or without
    if answer_only(record.run_dir):
        record.scheme = str(
            (doc or {}).get("scheme") or read_config(record.run_dir, read_meta(record.run_dir)).pos.name
        )
        record.status = ANSWER_ONLY
        record.error = "trained on answer tokens only (train.loss_on=answer): no perplexity over every token"
        return
    if not doc or not doc.get("entries"):
        record.status, record.error = "missing", "not evaluated yet (run posenc eval-extrapolate)"
        return
    record.scheme = str(doc.get("scheme", ""))
    if not is_hf_dir(record.run_dir) and (why := incomplete_reason(read_meta(record.run_dir))) is not None:
        record.status = "missing"  # its weights are not the finished run's: cells stored on them are not shown
        record.error = f"incomplete ({why}); resume it with posenc train --resume {record.run_dir}"
        return
    record.tokenizer, record.tokenizer_name = run_tokenizer(record.run_dir)
    record.train_length = doc.get("train_length")
    record.base_length = doc.get("base_length")
    current = current_checkpoint(record.run_dir)
    entries = [e for e in doc["entries"] if checkpoint_key(e) == current]
    if not entries:
        record.status = "missing"
        record.error = (
            f"evaluated only on an earlier checkpoint, not on step {current[0]} (run posenc eval-extrapolate)"
        )
        return
    record.entries = [e for e in entries if keep is None or _in_lengths(e, keep)]
