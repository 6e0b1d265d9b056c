"""The cost curve behind `posenc bench --eval-lengths`: time per token and peak memory of one evaluation forward
(eval mode, no gradients, batch 1) against length, for every scheme, each (scheme, length) in a fresh process.

Memory. On CPU a case reports its own process's peak resident set (VmHWM, `bench.peak_rss_mib`) and the same
measure just before the first full-length forward (after the model is built and a 64-token warm-up has run), so the
increase is what the forward itself needed. A fresh process per case makes the high-water mark the case's own;
VmHWM rather than `ru_maxrss` because Linux carries a parent's resident size into a child's `ru_maxrss` across
fork + exec. Resident memory rather than torch's CPU memory profiler: the profiler counts the allocator's tensors
only, not what the machine must hold, and slows the forward it measures. On CUDA: `torch.cuda.max_memory_allocated`.

Limits. A case is never run past `memory_limit_gib` (default 24 GiB, capped at the memory this machine has
available when the curve starts) nor past a scheme's `time_budget_s` (the wall time of all its cases, process
starts included). Before a case, its memory and time are predicted from the scheme's two previous measurements
(the local power law, exponent clamped: time 1..2, memory 0..2, attention being at most quadratic); a case whose
prediction exceeds a limit is skipped. While it runs, the parent polls the child's resident set (CPU) and its
wall time and stops it at either limit; on CUDA the child caps its allocator at the limit. Each stops the scheme:
longer lengths are not run either. Every (scheme, length) ends in one of four states:

- measured;
- not measured (why): skipped or stopped by a limit, or after a shorter length was;
- cannot measure (why): the scheme cannot read that many positions (e.g. a learned table), so neither can longer;
- failed (why): the case crashed.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from posenc_cli.config import Config, ModelConfig, build_dataclass
from posenc_cli.errors import ConfigError, LengthBeyondScheme
from posenc_cli.model import GPT
from posenc_cli.perf.bench import bench_vocab_size, die_with_parent, load_average, median, memory_mib, timed
from posenc_cli.positional import config_class, registry
from posenc_cli.run.device import autocast, describe_device, resolve_device, resolve_precision, threads

MEASURED = "measured"
NOT_MEASURED = "not measured"
CANNOT = "cannot measure"
FAILED = "failed"
STATES = (MEASURED, NOT_MEASURED, CANNOT, FAILED)
CSV_COLUMNS = (
    "scheme",
    "length",
    "status",
    "reason",
    "us_per_token",
    "tokens_per_s",
    "seconds",
    "repeats",
    "peak_mib",
    "base_mib",
    "increase_mib",
    "wall_s",
)
TIME_EXPONENT = (1.0, 2.0)  # clamp of the local power law predicting a case's time from the two before it
MEMORY_EXPONENT = (0.0, 2.0)
WARMUP_TOKENS = 64
GIB = 2**30
Progress = Callable[[str], None]


@dataclass(kw_only=True)
class CurveOptions:
    """What the cost curve measures: `lengths` (tokens), `schemes` (None: every registered one), the limits."""

    lengths: tuple[int, ...]
    schemes: tuple[str, ...] | None = None
    memory_limit_gib: float = 24.0
    time_budget_s: float | None = 300.0  # per scheme, all its cases; None: no budget
    min_seconds: float = 1.0  # forwards are repeated until they take this long together ...
    max_repeats: int = 3  # ... or this many have run (the median is reported)

    def validate(self) -> None:
        if not self.lengths:
            raise ConfigError("--eval-lengths needs at least one length")
        if any(n < 1 for n in self.lengths):
            raise ConfigError(f"--eval-lengths: lengths must be >= 1, got {min(self.lengths)}")
        if len(set(self.lengths)) != len(self.lengths):
            raise ConfigError("--eval-lengths: a length is given twice")
        if not (self.memory_limit_gib > 0 and math.isfinite(self.memory_limit_gib)):
            raise ConfigError(f"--memory-limit must be a positive number of GiB, got {self.memory_limit_gib}")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ConfigError(f"--time-budget must be a positive number of seconds, got {self.time_budget_s}")
        if self.schemes is not None:
            known = registry()
            unknown = [s for s in self.schemes if s not in known]
            if unknown or not self.schemes:
                raise ConfigError(f"--schemes: unknown scheme '{','.join(unknown)}' (available: {', '.join(known)})")


# ----------------------------------------------------------------------------------------------------------------
# One case, in its own process.


@dataclass(kw_only=True)
class CurveCase:
    """One (scheme, length) forward, JSON across processes. `pos` holds the scheme's config fields."""

    model: dict[str, Any]
    scheme: str
    pos: dict[str, Any] = field(default_factory=dict)
    vocab_size: int
    train_length: int
    length: int
    precision: str
    device: str
    threads: int
    min_seconds: float = 1.0
    max_repeats: int = 3
    memory_limit_bytes: int | None = None  # enforced here on CUDA; on CPU the parent watches the resident set


def run_case(case: CurveCase) -> dict[str, Any]:
    """In this process: build the model, warm up on 64 tokens, then time full-length forwards (eval mode, no
    gradients, batch 1) until `min_seconds` or `max_repeats`; returns the median and the memory before and after."""
    device = torch.device(case.device)
    if case.threads > 0:
        torch.set_num_threads(case.threads)
    if device.type == "cuda" and case.memory_limit_bytes:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, case.memory_limit_bytes / total), device)
    torch.manual_seed(0)
    pos = build_dataclass(config_class(case.scheme), {**case.pos, "name": case.scheme}, "pos")
    model_cfg = build_dataclass(ModelConfig, case.model, "model")
    model = GPT(model_cfg, pos, case.vocab_size, case.train_length).to(device).eval()
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, case.vocab_size, (1, case.length), generator=g).to(device)  # (1, T)

    def forward(x: torch.Tensor) -> None:
        with torch.no_grad(), autocast(device, case.precision):  # type: ignore[arg-type]
            model(x)

    try:
        forward(idx[:, : min(case.length, WARMUP_TOKENS)])  # kernels and allocator warm, no full-length peak yet
        base = memory_mib(device, reset=True)
        times: list[float] = []
        while not times or (sum(times) < case.min_seconds and len(times) < case.max_repeats):
            times.append(timed(lambda: forward(idx), device))
    except LengthBeyondScheme as e:
        return {"status": CANNOT, "reason": e.reason}
    except torch.cuda.OutOfMemoryError:
        return {"status": NOT_MEASURED, "reason": f"over the memory limit ({_gib(case.memory_limit_bytes)})"}
    return {
        "status": MEASURED,
        "seconds": median(times),
        "repeats": len(times),
        "peak_mib": memory_mib(device),
        "base_mib": base,
    }


def spawn_case(case: CurveCase, *, timeout_s: float | None, memory_limit_bytes: int, poll_s: float = 0.05) -> dict:
    """Run `run_case` in a fresh interpreter; stop it when its resident set (CPU) passes `memory_limit_bytes` or it
    runs past `timeout_s` (both: not measured). Adds `wall_s`, the case's wall time including the process start."""
    cmd = [sys.executable, "-m", "posenc_cli.perf.cost_curve", "--case", json.dumps(asdict(case))]
    env = {**os.environ, "OMP_NUM_THREADS": str(case.threads)} if case.threads > 0 else None
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, preexec_fn=die_with_parent)
        stopped = None
        try:
            while proc.poll() is None:
                elapsed = time.perf_counter() - start
                rss = resident_bytes(proc.pid) if case.device == "cpu" else None
                if rss is not None and rss > memory_limit_bytes:
                    stopped = f"over the memory limit ({_gib(memory_limit_bytes)}): stopped at {_gib(rss)} resident"
                elif timeout_s is not None and elapsed > timeout_s:
                    stopped = f"time budget spent: stopped after {elapsed:.0f} s"
                if stopped:
                    break
                time.sleep(poll_s)
        finally:  # stopped by a limit, or this process interrupted: the case never outlives the curve
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if stopped:
        return {"status": NOT_MEASURED, "reason": stopped, "wall_s": wall}
    if proc.returncode != 0:
        return {"status": FAILED, "reason": _failure(proc.returncode, stderr), "wall_s": wall}
    return {**json.loads(stdout.strip().splitlines()[-1]), "wall_s": wall}


def resident_bytes(pid: int) -> int | None:
    """VmRSS of process `pid` (None where /proc cannot tell, e.g. it has just exited or this is not Linux)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _failure(returncode: int, stderr: str) -> str:
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        hint = " (the system's out-of-memory killer?)" if -returncode == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return (stderr.strip().splitlines() or [f"exit status {returncode}, no output"])[-1]


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


# ----------------------------------------------------------------------------------------------------------------
# Predicting the next case from the scheme's previous ones (to skip, never to report).


def predict(points: Sequence[tuple[int, float]], length: int, lo: float, hi: float) -> float | None:
    """`value` at `length` from the last two (length, value) points by their local power law, the exponent clamped
    to [lo, hi]; None with fewer than two points or non-positive values."""
    if len(points) < 2:
        return None
    (n1, v1), (n2, v2) = points[-2], points[-1]
    if v1 <= 0 or v2 <= 0 or n1 == n2:
        return None
    k = min(hi, max(lo, math.log(v2 / v1) / math.log(n2 / n1)))
    return v2 * (length / n2) ** k


def skip_reason(
    done: Sequence[dict[str, Any]], length: int, opts: CurveOptions, limit_bytes: int, spent_s: float
) -> str | None:
    """Why the case at `length` is not run, given the scheme's measured rows `done` (in length order), or None."""
    measured = [r for r in done if r["status"] == MEASURED]
    increase = predict([(r["length"], r["increase_mib"]) for r in measured], length, *MEMORY_EXPONENT)
    if increase is not None:
        total = (measured[-1]["base_mib"] + increase) * 2**20
        if total > limit_bytes:
            return f"over the memory limit ({_gib(limit_bytes)}): predicted {_gib(total)} from the shorter lengths"
    if opts.time_budget_s is None:
        return None
    left = opts.time_budget_s - spent_s
    forward = predict([(r["length"], r["seconds"]) for r in measured], length, *TIME_EXPONENT)
    if forward is not None:
        last = measured[-1]
        overhead = max(0.0, last["wall_s"] - last["seconds"] * last["repeats"])  # process start, build, warm-up
        repeats = max(1, min(opts.max_repeats, math.ceil(opts.min_seconds / max(forward, 1e-9))))
        wall = overhead + forward * repeats
        if wall > left:
            return f"time budget ({opts.time_budget_s:.0f} s per scheme): predicted {wall:.0f} s, {left:.0f} s left"
    if left <= 0:
        return f"time budget ({opts.time_budget_s:.0f} s per scheme) spent"
    return None


# ----------------------------------------------------------------------------------------------------------------
# The whole curve.


def run_curve(cfg: Config, opts: CurveOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Measure every (scheme, length) of `opts` on the device, threads and precision of `cfg.train`, length by
    length in increasing order (each scheme's cases in length order, so its limits can stop it); returns the
    JSON-ready result (`rows` by scheme, `reach`, the machine and the limits)."""
    opts.validate()
    cfg.validate()
    say = progress or (lambda message: None)
    device = resolve_device(cfg.train.device)
    precision = resolve_precision(cfg.train.precision, device)
    schemes = opts.schemes or tuple(registry())
    lengths = tuple(sorted(opts.lengths))
    vocab = bench_vocab_size(cfg)
    available = available_bytes() if device.type == "cpu" else None
    requested = int(opts.memory_limit_gib * GIB)
    limit = min(requested, available) if available else requested
    result: dict[str, Any] = {
        "device": describe_device(device),
        "torch": torch.__version__,
        "precision": precision,
        "precision_setting": cfg.train.precision,
        "load_average_start": load_average(),
        "config": {**asdict(cfg.model), "train_length": cfg.train.seq_len, "vocab_size": vocab, "batch": 1},
        "lengths": list(lengths),
        "schemes": list(schemes),
        "memory_limit_gib": opts.memory_limit_gib,
        "memory_available_gib": None if available is None else round(available / GIB, 2),
        "memory_limit_applied_gib": round(limit / GIB, 2),
        "time_budget_s": opts.time_budget_s,
        "memory_measure": "peak resident set (VmHWM) of the case's own process"
        if device.type == "cpu"
        else "torch.cuda.max_memory_allocated",
    }
    done: dict[str, list[dict[str, Any]]] = {scheme: [] for scheme in schemes}
    with threads(cfg.train.threads) as n_threads:
        result["threads"] = n_threads if device.type == "cpu" else None
        for length in lengths:  # every scheme at one length, then the next: drift hits a length's schemes alike
            for scheme in schemes:
                case = CurveCase(
                    model=asdict(cfg.model),
                    scheme=scheme,
                    pos=asdict(cfg.pos) if scheme == cfg.pos.name else {},
                    vocab_size=vocab,
                    train_length=cfg.train.seq_len,
                    length=length,
                    precision=precision,
                    device=str(device),
                    threads=n_threads if device.type == "cpu" else 0,
                    min_seconds=opts.min_seconds,
                    max_repeats=opts.max_repeats,
                    memory_limit_bytes=limit,
                )
                done[scheme].append(next_row(case, done[scheme], opts, limit, say))
    rows = [row for scheme in schemes for row in done[scheme]]  # by scheme, lengths increasing
    result["rows"] = rows
    result["reach"] = reach(rows, limit / 2**20)
    result["load_average_end"] = load_average()
    return result


def next_row(case: CurveCase, done: list[dict[str, Any]], opts: CurveOptions, limit: int, say: Progress) -> dict:
    """The row of `case`: inherited from a shorter length that stopped the scheme, skipped by a limit, or run."""
    row: dict[str, Any] = {"scheme": case.scheme, "length": case.length}
    stop = next((r for r in done if r["status"] != MEASURED or r.get("over_limit")), None)
    if stop is not None:
        if stop["status"] == CANNOT:
            return {**row, "status": CANNOT, "reason": stop["reason"]}
        why = "over the memory limit" if stop.get("over_limit") else stop["status"]
        return {**row, "status": NOT_MEASURED, "reason": f"stopped: {why} at {stop['length']:,} tokens"}
    spent = sum(r.get("wall_s", 0.0) for r in done)
    skip = skip_reason(done, case.length, opts, limit, spent)
    if skip:
        return {**row, "status": NOT_MEASURED, "reason": skip}
    left = None if opts.time_budget_s is None else opts.time_budget_s - spent
    say(f"{case.scheme} at {case.length:,} tokens ({case.precision})")
    out = spawn_case(case, timeout_s=left, memory_limit_bytes=limit)
    row.update(out)
    if out["status"] == MEASURED:
        row["us_per_token"] = out["seconds"] / case.length * 1e6
        row["tokens_per_s"] = case.length / out["seconds"]
        row["increase_mib"] = max(0.0, out["peak_mib"] - out["base_mib"])
        row["over_limit"] = out["peak_mib"] * 2**20 > limit  # finished between two polls of the watchdog
    return row


def reach(rows: Iterable[dict[str, Any]], limit_mib: float) -> dict[str, dict[str, Any]]:
    """Per scheme: `longest`, the longest length measured within `limit_mib`; `beyond`, the first length that was
    not; `stopped_by`, why; `stop`, what stopped it: "memory" (so the scheme's reach in the limit lies between
    `longest` and `beyond`), "time" or None (every length asked was measured; both mean it reaches at least
    `longest`), "cannot" or "failed"."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        blank = {"longest": None, "peak_mib": None, "beyond": None, "stopped_by": None, "stop": None}
        entry = out.setdefault(r["scheme"], blank)
        if entry["beyond"] is not None:
            continue
        if r["status"] == MEASURED and r["peak_mib"] <= limit_mib:
            entry.update(longest=r["length"], peak_mib=r["peak_mib"])
        elif r["status"] == MEASURED:
            entry.update(beyond=r["length"], stopped_by=f"measured {r['peak_mib']:,.0f} MiB, over the limit")
            entry["stop"] = "memory"
        else:
            entry.update(beyond=r["length"], stopped_by=f"{r['status']}: {r['reason']}", stop=_stop_kind(r))
    return out


def _stop_kind(row: dict[str, Any]) -> str:
    if row["status"] == NOT_MEASURED:
        return "memory" if row["reason"].startswith("over the memory limit") else "time"
    return "cannot" if row["status"] == CANNOT else "failed"


def csv_text(result: dict[str, Any]) -> str:
    """The result's rows as CSV with a header, columns `CSV_COLUMNS` ('' where a value does not apply)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    writer.writerows([_csv(r.get(c)) for c in CSV_COLUMNS] for r in result["rows"])
    return buffer.getvalue()


def _csv(value: Any) -> Any:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else value


def main(argv: list[str] | None = None) -> None:
    """`python -m posenc_cli.perf.cost_curve --case JSON`: one case, its result as one JSON line on stdout."""
    parser = argparse.ArgumentParser(prog="python -m posenc_cli.perf.cost_curve")
    parser.add_argument("--case", required=True, help="CurveCase fields as JSON")
    args = parser.parse_args(argv)
    print(json.dumps(run_case(CurveCase(**json.loads(args.case)))))


if __name__ == "__main__":
    main()
