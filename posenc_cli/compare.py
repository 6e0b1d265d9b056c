"""Gather evaluation results from run and sweep directories on disk, aggregate them and write the comparison.

Everything is read from disk (`eval/extrapolate.json` per run, `sweep.json` per sweep), so a comparison works the same
whether the jobs ran here, in parallel processes or on a cluster.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc_cli.errors import UserError
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


@dataclass(kw_only=True)
class Cell:
    values: list[float]
    na_reason: str = ""

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) > 1 else None


@dataclass(kw_only=True)
class Row:
    label: str
    runs: int
    failed: int
    cells: dict[float, Cell]
    base_length: int | None
    train_length: int | None = None
    scheme: str = ""


# ----------------------------------------------------------------------------------------------------------------
# Gathering.


def gather(paths: list[Path]) -> list[RunRecord]:
    """Records for every run under `paths`: sweep directories use their plan's labels, other runs their names."""
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
            continue
        runs = find_runs([path])
        if not runs:
            raise UserError(f"{path} holds no posenc run or sweep directory")
        for run in runs:
            record = RunRecord(label=run.name, run_dir=run)
            _fill(record)
            records.append(record)
    return records


def _fill(record: RunRecord) -> None:
    from posenc_cli.evaluate import load_results

    doc = load_results(record.run_dir, missing_ok=True)
    if not doc or not doc.get("entries"):
        record.status, record.error = "missing", "not evaluated yet (run posenc eval-extrapolate)"
        return
    record.scheme = str(doc.get("scheme", ""))
    record.train_length = doc.get("train_length")
    record.base_length = doc.get("base_length")
    record.entries = list(doc["entries"])
    if record.label == record.run_dir.name and record.scheme:
        record.label = f"{record.run_dir.name} ({record.scheme})"


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


def aggregate(records: list[RunRecord], metric: str = "ppl") -> tuple[list[Row], tuple[str, int | None]]:
    """Rows grouped by label (mean ± std over seeds), in first-seen order, and the protocol they use."""
    protocol = dominant_protocol(records)
    rows: dict[str, Row] = {}
    for r in records:
        row = rows.setdefault(
            r.label, Row(label=r.label, runs=0, failed=0, cells={}, base_length=r.base_length, scheme=r.scheme)
        )
        row.base_length = row.base_length or r.base_length
        row.train_length = row.train_length or r.train_length
        row.scheme = row.scheme or r.scheme
        if r.status != "ok":
            row.failed += r.status == "failed"
            continue
        row.runs += 1
        for multiple, e in select_entries(r, protocol).items():
            cell = row.cells.setdefault(multiple, Cell(values=[]))
            if e.get("status") == "ok" and e.get(metric) is not None and math.isfinite(float(e[metric])):
                cell.values.append(float(e[metric]))
            else:
                cell.na_reason = str(e.get("reason") or "n/a")
    return list(rows.values()), protocol


def multiples(rows: list[Row]) -> list[float]:
    return sorted({m for row in rows for m in row.cells})


def growth(row: Row) -> float | None:
    """metric at the longest multiple with a value / metric at 1x (the extrapolation ratio)."""
    at_one = row.cells.get(1.0)
    if at_one is None or at_one.mean is None:
        return None
    ok = [m for m, c in row.cells.items() if c.mean is not None]
    longest = max(ok)
    return None if longest == 1.0 else row.cells[longest].mean / at_one.mean  # type: ignore[operator]


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


def to_markdown(rows: list[Row], metric: str, baseline: Row | None = None) -> str:
    cols = multiples(rows)
    head = "| run | " + " | ".join(f"{m:g}×" for m in cols) + " | max/1× |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for row in rows:
        cells = [format_cell(row, m, metric, baseline) for m in cols]
        g = growth(row)
        lines.append(f"| {row.label} | " + " | ".join(cells) + f" | {'' if g is None else f'{g:.2f}'} |")
    return "\n".join(lines) + "\n"


def format_cell(row: Row, multiple: float, metric: str, baseline: Row | None = None) -> str:
    cell = row.cells.get(multiple)
    if row.runs == 0 and row.failed:
        return "failed"
    if cell is None:
        return ""
    if cell.mean is None:
        return "n/a"
    value, std = cell.mean, cell.std
    if baseline is not None:
        ref = baseline.cells.get(multiple)
        if ref is None or ref.mean is None:
            return "n/a"
        value, std = value / ref.mean, None if std is None else std / ref.mean
    digits = 3 if metric != "ppl" or baseline is not None else 2
    return f"{value:.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")


def find_baseline(rows: list[Row], records: list[RunRecord], baseline: str | None) -> Row | None:
    if baseline is None:
        return None
    for row in rows:
        if row.label == baseline:
            return row
    target = Path(baseline).resolve()
    for r in records:
        if r.run_dir.resolve() == target:
            return next(row for row in rows if row.label == r.label)
    raise UserError(f"--baseline {baseline} matches no row label or run directory")


def write_json_csv(records: list[RunRecord], out_dir: Path) -> tuple[Path, Path]:
    rows_json = records_to_json(records)
    json_path, csv_path = Path(out_dir) / "results.json", Path(out_dir) / "results.csv"
    atomic_write_json(json_path, rows_json)
    atomic_write_text(csv_path, to_csv(rows_json))
    return json_path, csv_path


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2)
