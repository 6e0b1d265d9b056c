"""Gather evaluation results from run and sweep directories on disk, aggregate them and write the comparison.

Everything is read from disk (`eval/extrapolate.json` per run, `sweep.json` per sweep), so a comparison works the same
whether the jobs ran here, in parallel processes or on a cluster.

A run has one label wherever it is shown: a sweep's job keeps its plan label (and the plan's order) whether it is
reached through the sweep directory, a stage directory below it, or the run directory itself; any other run below a
sweep is named by its path in the sweep (`train/pos=rope-yarnx8`). A sweep's table has the sweep's own lengths
(`eval.lengths` of its jobs): a length evaluated later for some run only shows with `all_lengths`.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc_cli.errors import CheckpointError, UserError
from posenc_cli.evaluation.perplexity import find_runs
from posenc_cli.evaluation.results import checkpoint_identity, checkpoint_key, load_results
from posenc_cli.fsutil import atomic_write_json, atomic_write_text
from posenc_cli.report.tables import (
    Cell,
    Column,
    describe_lengths,
    describe_measurement,
    describe_protocol,
    extrapolation_rows,
    fmt_cell,
    reason_lines,
    render_table,
    run_label,
    table_legend,
)
from posenc_cli.run.checkpoint import RunMeta, read_config, read_meta, read_run_meta
from posenc_cli.run.hf_run import is_hf_dir, weights_identity
from posenc_cli.sweep.runner import job_status, read_failure, read_plan

ENTRY_FIELDS = (
    "protocol",
    "stride",
    "length",
    "multiple",
    "tokens",
    "dtype",
    "device",
    "status",
    "reason",
    "ppl",
    "nll",
    "bpb",
)


@dataclass(kw_only=True)
class RunRecord:
    """One run (or one failed sweep job) with its evaluation entries."""

    label: str
    run_dir: Path
    stage: str = ""
    job: str = ""
    status: str = "ok"  # ok | failed | missing
    error: str = ""
    scheme: str = ""
    train_length: int | None = None
    base_length: int | None = None
    entries: list[dict[str, Any]] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------------------------
# Gathering.


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
            named = sorted(zip(run_names(runs), runs, strict=True), key=lambda pair: pair[0].order)
            for name, run in named:
                records.append(_run_record(run, name, None if all_lengths else _sweep_lengths_of(run)))
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
        for run in _runs_below(path):
            if run.resolve() not in planned:
                records.append(_run_record(run, RunName(run.relative_to(path).as_posix(), False, ()), keep))
    return records


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
    """eval-extrapolate results (each with its "path") labelled and ordered as `compare` shows them."""
    names = run_names([Path(r["path"]) for r in results])
    order = sorted(range(len(results)), key=lambda i: names[i].order)
    return [{**results[i], "label": shown_label(names[i], str(results[i]["scheme"]))} for i in order]


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


def _fill(record: RunRecord, keep: set[tuple[str, float]] | None = None) -> None:
    """The run's stored entries of its current checkpoint (cells of an earlier one, or of none recorded, are not
    measured), within `keep`'s lengths."""
    doc = load_results(record.run_dir, missing_ok=True)
    if not doc or not doc.get("entries"):
        record.status, record.error = "missing", "not evaluated yet (run posenc eval-extrapolate)"
        return
    record.scheme = str(doc.get("scheme", ""))
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


# ----------------------------------------------------------------------------------------------------------------
# Aggregation.


def dominant_protocol(records: list[RunRecord]) -> tuple[str, int | None]:
    """The (protocol, stride) most entries use; non-overlapping wins ties."""
    counts = Counter((e["protocol"], e.get("stride")) for r in records for e in r.entries)
    if not counts:
        return ("nonoverlap", None)
    return max(counts, key=lambda k: (counts[k], k[0] == "nonoverlap"))


def select_entries(record: RunRecord, protocol: tuple[str, int | None]) -> dict[float, dict[str, Any]]:
    """The newest entry per multiple for one protocol."""
    chosen: dict[float, dict[str, Any]] = {}
    for e in record.entries:
        if (e["protocol"], e.get("stride")) != protocol:
            continue
        key = round(float(e["multiple"]), 6)
        if key not in chosen or str(e.get("created", "")) >= str(chosen[key].get("created", "")):
            chosen[key] = e
    return chosen


def records_to_json(records: list[RunRecord]) -> list[dict[str, Any]]:
    """One record per run and length: labels plus the entry fields (failed jobs get one record with the error)."""
    protocol = dominant_protocol(records)
    out = []
    for r in records:
        base = {
            "label": r.label,
            "stage": r.stage,
            "job": r.job,
            "run_dir": str(r.run_dir),
            "scheme": r.scheme,
            "train_length": r.train_length,
            "base_length": r.base_length,
            "job_status": r.status,
            "error": r.error,
        }
        if r.status != "ok":
            out.append(base)
            continue
        for _, e in sorted(select_entries(r, protocol).items()):
            out.append({**base, **e})
    return out


def to_csv(rows_json: list[dict[str, Any]]) -> str:
    columns = ["label", "stage", "job", "scheme", "job_status", "error", "train_length", "base_length", *ENTRY_FIELDS]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for rec in rows_json:
        writer.writerow({k: rec.get(k) for k in columns})
    return buf.getvalue()


def to_results(records: list[RunRecord]) -> list[dict[str, Any]]:
    """Records as eval-extrapolate result docs (one protocol), labelled for the report and plot functions.

    A job that failed or has no results becomes an entry-less row marked in its label, so it shows in the table.
    """
    protocol = dominant_protocol(records)
    out = []
    for r in records:
        label = r.label if r.status == "ok" else f"{r.label} [{r.status}]"
        entries = [e for _, e in sorted(select_entries(r, protocol).items())] if r.status == "ok" else []
        out.append(
            {
                "run": label,
                "label": label,
                "scheme": r.scheme,
                "train_length": r.train_length,
                "base_length": r.base_length,
                "entries": entries,
            }
        )
    return out


def comparison(
    records: list[RunRecord], *, metric: str = "ppl", baseline: str | None = None
) -> tuple[list[Any], list[Any], str]:
    """(columns, rows, title) of the comparison table: one row per label, mean ± std over its runs (seeds)."""
    results = to_results(records)
    columns, rows = extrapolation_rows(
        results, metric=metric, label=lambda r: r["label"], aggregate_by=lambda r: r["label"], ratio=True
    )
    if baseline is not None:
        ref = _baseline_row(rows, records, baseline)
        relative_to_row(rows, ref)
        columns = [Column(c.key, f"{c.header}\n÷ {ref.label}", best=None) if c.key == "ratio" else c for c in columns]
    measured = [r for r in results if r["entries"]]
    what = {"ppl": "Perplexity", "bpb": "Bits per byte", "nll": "Mean NLL (nats)"}[metric]
    title = f"{what}{' relative to ' + baseline if baseline else ''} by evaluation length"
    if measured:
        title += f" · {describe_protocol(measured)} · base length {describe_lengths(measured, 'base_length')} tokens"
    return columns, rows, title


def relative_to_row(rows: list[Any], ref: Any) -> None:
    """Divide every cell by the reference row's mean in the same column, the ratio column included: a row's
    "16× / 1×" becomes its ratio over the reference's ratio (how much more it degrades than the reference)."""
    ref_means = {key: cell.mean for key, cell in ref.cells.items()}
    for row in rows:
        for key, cell in row.cells.items():
            base = ref_means.get(key)
            if cell.values and not base:
                cell.values, cell.reason = [], cell.reason or f"{ref.label} has no value here"
            cell.values = [v / base for v in cell.values] if base else []


def _baseline_row(rows: list[Any], records: list[RunRecord], baseline: str) -> Any:
    by_label = {row.label: row for row in rows}
    if baseline in by_label:
        return by_label[baseline]
    target = Path(baseline).resolve()
    for r in records:
        if r.run_dir.resolve() == target and r.label in by_label:
            return by_label[r.label]
    raise UserError(f"--baseline {baseline} matches no row label or run directory")


def to_markdown(columns: list[Any], rows: list[Any]) -> str:
    header = "| run | " + " | ".join(c.header.replace("\n", " ") for c in columns) + " |"
    lines = [header, "|---" * (len(columns) + 1) + "|"]
    for row in rows:
        cells = [fmt_cell(row.cells.get(c.key, Cell())) for c in columns]  # unmeasured: n/a, as in the rich table
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(records: list[RunRecord], out_dir: Path) -> list[Path]:
    """results.json, results.csv, extrapolation.png and per_position.png in `out_dir`."""
    # deferred: keeps matplotlib off posenc --help start-up
    from posenc_cli.report.plots import per_position_figure, ppl_vs_length_figure, save_figure

    out_dir = Path(out_dir)
    rows_json = records_to_json(records)
    paths = [out_dir / "results.json", out_dir / "results.csv"]
    atomic_write_json(paths[0], rows_json)
    atomic_write_text(paths[1], to_csv(rows_json))
    measured = [r for r in to_results(records) if r["entries"]]
    if measured:
        paths.append(save_figure(ppl_vs_length_figure(measured), out_dir / "extrapolation.png"))
        paths.append(save_figure(per_position_figure(measured), out_dir / "per_position.png"))
    return paths


def render(
    records: list[RunRecord],
    *,
    metric: str = "ppl",
    baseline: str | None = None,
    fmt: str = "table",
    out: Path | None = None,
    console: Any,
) -> None:
    """Print the comparison in `fmt` (table, csv, json, markdown); with `out`, also write the files there."""
    if fmt == "json":
        console.print_json(json.dumps(records_to_json(records)))
    elif fmt == "csv":
        console.print(to_csv(records_to_json(records)), end="", markup=False, highlight=False)
    else:
        columns, rows, title = comparison(records, metric=metric, baseline=baseline)
        caption = caption_lines(records, baseline)
        if fmt == "markdown":
            legend = table_legend(columns, rows)
            notes = "".join(f"\n{line}  " for line in [legend, *caption] if line)
            console.print(f"**{title}**\n\n" + to_markdown(columns, rows) + notes, markup=False, highlight=False)
        else:
            console.print(render_table(columns, rows, title=title, caption="\n".join(caption)))
    if out is not None:
        for path in write_outputs(records, out):
            console.print(f"wrote {path}", highlight=False)


def caption_lines(records: list[RunRecord], baseline: str | None = None) -> list[str]:
    """Under the table: where the numbers were measured (precision, device), why each n/a is n/a, failed jobs."""
    results = [r for r in to_results(records) if r["entries"]]
    lines = [f"Measured in {describe_measurement(results)}."] if results else []
    lines += reason_lines(results, lambda r: r["label"])
    if baseline is not None:
        lines.append(f"Every column, the ratio included, is divided by {baseline}'s; n/a where it has no value.")
    lines += [f"{r.label} [{r.status}]: {r.error}" for r in records if r.status != "ok"]
    return lines


def comparison_outputs(records: list[RunRecord], sweep_dir: Path, *, console: Any) -> int:
    """The end of a sweep: table, files in the sweep directory; returns the number of failed jobs."""
    render(records, out=sweep_dir, console=console)
    return sum(r.status == "failed" for r in records)
