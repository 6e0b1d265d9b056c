"""Gather evaluation results from run and sweep directories on disk, aggregate them and write the comparison.

Everything is read from disk (`eval/extrapolate.json` per run, `sweep.json` per sweep), so a comparison works the same
whether the jobs ran here, in parallel processes or on a cluster.
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
from posenc_cli.fsutil import atomic_write_json, atomic_write_text

ENTRY_FIELDS = ("protocol", "stride", "length", "multiple", "tokens", "dtype", "status", "reason", "ppl", "nll", "bpb")


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


def gather(paths: list[Path]) -> list[RunRecord]:
    """Records for every run under `paths`: a sweep directory's planned jobs under their plan's labels, then any other
    run found below it (an `extend` output, the jobs of an earlier sweep into the same directory) under its path
    relative to the sweep; other runs under their names."""
    from posenc_cli.evaluate import find_runs
    from posenc_cli.sweep import job_status, read_failure, read_plan

    records: list[RunRecord] = []
    for path in map(Path, paths):
        if not path.exists():
            raise UserError(f"{path} does not exist")
        plan = read_plan(path)
        if plan is not None:
            for job in plan["jobs"]:
                job_dir = path / job["dir"]
                status = job_status(job_dir)
                record = RunRecord(label=job["label"], run_dir=job_dir, stage=job["stage"], job=job["name"])
                if status == "failed":
                    record.status, record.error = "failed", read_failure(job_dir)
                elif status != "done":
                    record.status, record.error = "missing", "no results (not run yet, or interrupted)"
                else:
                    _fill(record)
                records.append(record)
            planned = {(path / job["dir"]).resolve() for job in plan["jobs"]}
            for run in _runs_below(path):
                if run.resolve() not in planned:
                    records.append(_run_record(run, run.relative_to(path).as_posix()))
            continue
        runs = find_runs([path])
        if not runs:
            raise UserError(f"{path} holds no posenc run or sweep directory")
        records.extend(_run_record(run, run.name) for run in runs)
    return records


def _runs_below(path: Path) -> list[Path]:
    """Run directories below a sweep directory (none is fine: its jobs may not have started)."""
    from posenc_cli.evaluate import find_runs

    try:
        return find_runs([path])
    except CheckpointError:
        return []


def _run_record(run: Path, name: str) -> RunRecord:
    """A run outside any sweep plan, labelled `name`, plus its scheme unless the name already says it."""
    from posenc_cli.report import run_label

    record = RunRecord(label=name, run_dir=run)
    _fill(record)
    record.label = run_label({"run": name, "scheme": record.scheme})
    return record


def _fill(record: RunRecord) -> None:
    from posenc_cli.eval_results import load_results

    doc = load_results(record.run_dir, missing_ok=True)
    if not doc or not doc.get("entries"):
        record.status, record.error = "missing", "not evaluated yet (run posenc eval-extrapolate)"
        return
    record.scheme = str(doc.get("scheme", ""))
    record.train_length = doc.get("train_length")
    record.base_length = doc.get("base_length")
    record.entries = list(doc["entries"])


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
    from posenc_cli.report import describe_lengths, describe_protocol, extrapolation_rows

    results = to_results(records)
    columns, rows = extrapolation_rows(
        results, metric=metric, label=lambda r: r["label"], aggregate_by=lambda r: r["label"], ratio=True
    )
    if baseline is not None:
        ref = _baseline_row(rows, records, baseline)
        ref_means = {key: cell.mean for key, cell in ref.cells.items()}
        for row in rows:
            for key, cell in row.cells.items():
                if key == "ratio":
                    continue
                base = ref_means.get(key)
                cell.values = [v / base for v in cell.values] if base else []
    measured = [r for r in results if r["entries"]]
    what = {"ppl": "Perplexity", "bpb": "Bits per byte", "nll": "Mean NLL (nats)"}[metric]
    title = f"{what}{' relative to ' + baseline if baseline else ''} by evaluation length"
    if measured:
        title += f" · {describe_protocol(measured)} · base length {describe_lengths(measured, 'base_length')} tokens"
    return columns, rows, title


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
    from posenc_cli.report import Cell, fmt_cell

    header = "| run | " + " | ".join(c.header.replace("\n", " ") for c in columns) + " |"
    lines = [header, "|---" * (len(columns) + 1) + "|"]
    for row in rows:
        cells = [fmt_cell(row.cells.get(c.key, Cell())) for c in columns]  # unmeasured: n/a, as in the rich table
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(records: list[RunRecord], out_dir: Path) -> list[Path]:
    """results.json, results.csv, extrapolation.png and per_position.png in `out_dir`."""
    from posenc_cli.plots import per_position_figure, ppl_vs_length_figure, save_figure

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
    from posenc_cli.report import render_table

    if fmt == "json":
        console.print_json(json.dumps(records_to_json(records)))
    elif fmt == "csv":
        console.print(to_csv(records_to_json(records)), end="", markup=False, highlight=False)
    else:
        columns, rows, title = comparison(records, metric=metric, baseline=baseline)
        if fmt == "markdown":
            console.print(f"**{title}**\n\n" + to_markdown(columns, rows), markup=False, highlight=False)
        else:
            console.print(render_table(columns, rows, title=title, caption=_failures(records)))
    if out is not None:
        for path in write_outputs(records, out):
            console.print(f"wrote {path}", highlight=False)


def _failures(records: list[RunRecord]) -> str | None:
    lines = [f"{r.label} [{r.status}]: {r.error}" for r in records if r.status != "ok"]
    return "\n".join(lines) or None


def comparison_outputs(records: list[RunRecord], sweep_dir: Path, *, console: Any) -> int:
    """The end of a sweep: table, files in the sweep directory; returns the number of failed jobs."""
    render(records, out=sweep_dir, console=console)
    return sum(r.status == "failed" for r in records)
