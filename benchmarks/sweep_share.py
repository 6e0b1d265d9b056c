"""A 5-job sweep one job after another vs N jobs at once on the same device (`hydra.launcher.n_jobs=N`).

    python benchmarks/sweep_share.py                                  # 5 tiny jobs: basic, then joblib n_jobs=5
    python benchmarks/sweep_share.py --jobs 2 --steps 60 --lengths 1,2   # a short CPU version
    python benchmarks/sweep_share.py --json out.json --out outputs/share  # keep the sweeps and a JSON record

The workload is `posenc sweep seeds` cut to one seed: model=tiny train=quick for pos=nope, sinusoidal, learned,
rope and alibi (five jobs; each trains `--steps` steps and evaluates at `--lengths` × 128 tokens), run twice into
fresh sweep directories, sequential (the basic launcher: one process, one job after another) and concurrent (joblib,
`--jobs` worker processes sharing the device; posenc gives each cores ÷ jobs threads and, on a GPU, starts each job
once its memory is free: posenc_cli/sweep/device_share.py). Reported: wall seconds, training tokens per second of
the whole sweep (every job's tokens ÷ wall time), jobs per minute, the speed-up, and the largest difference between
the two sweeps' validation losses (0 where each job computes the same either way).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCHEMES = "nope,sinusoidal,learned,rope,alibi"


def run_sweep(out: Path, launcher: list[str], args: argparse.Namespace) -> float:
    """Wall seconds of the sweep into the fresh directory `out` (its output goes to out.log)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "posenc_cli", "sweep", "seeds", f"pos={SCHEMES}", "train.seed=0"]
    cmd += [f"train.steps={args.steps}", f"eval.lengths=[{args.lengths}]", *args.overrides, *launcher]
    cmd += ["--out", str(out)]
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(out.with_suffix(".log"), "w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"sweep-share: the sweep into {out} failed (exit {done.returncode}); see {out}.log")
    return seconds


def job_records(out: Path) -> dict[str, dict[str, Any]]:
    """Each job's meta.json (tokens, val_loss, device, precision, threads), by job directory name."""
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((out / "train").glob("*/meta.json"))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5, help="joblib's n_jobs for the concurrent sweep")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--lengths", default="1,2,4", help="evaluation lengths, multiples of 128")
    parser.add_argument("--out", type=Path, default=None, help="keep the sweeps here (default: a temporary dir)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("overrides", nargs="*", help="more overrides for both sweeps, e.g. train.compile=true")
    args = parser.parse_args(argv)
    variants = {
        "sequential": [],
        f"concurrent-{args.jobs}": ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={args.jobs}"],
    }
    with tempfile.TemporaryDirectory(prefix="posenc-share-") as tmp:
        root = args.out or Path(tmp)
        seconds = {name: run_sweep(root / name, launcher, args) for name, launcher in variants.items()}
        records = {name: job_records(root / name) for name in variants}
    results: dict[str, dict[str, Any]] = {}
    for name, jobs in records.items():
        if len(jobs) != 5:
            raise SystemExit(f"sweep-share: {name} has {len(jobs)} trained jobs, not 5")
        tokens = sum(int(m["tokens"]) for m in jobs.values())
        first = next(iter(jobs.values()))
        results[name] = {
            "wall_s": seconds[name],
            "tokens_per_s": tokens / seconds[name],
            "jobs_per_min": 60 * len(jobs) / seconds[name],
            "device": first.get("device"),
            "precision": first.get("precision"),
            "threads_per_job": first.get("threads"),
        }
    seq, par = records["sequential"], records[f"concurrent-{args.jobs}"]
    diff = max(abs(float(seq[k]["val_loss"]) - float(par[k]["val_loss"])) for k in seq)
    speedup = seconds["sequential"] / seconds[f"concurrent-{args.jobs}"]
    print(f"5-job sweep (model=tiny, {args.steps} steps, eval at {args.lengths} x 128 tokens)")
    for name, r in results.items():
        print(f"  {name:14s} {r['wall_s']:7.1f} s  {r['tokens_per_s']:10,.0f} training tokens/s  "
              f"{r['jobs_per_min']:5.1f} jobs/min  ({r['device']}, {r['precision']}, {r['threads_per_job']} "
              "thread(s) per job)")  # fmt: skip
    print(f"  concurrent vs sequential: {speedup:.2f}x; largest val_loss difference {diff:.3g}")
    if args.json:
        record = {"results": results, "speedup": speedup, "max_val_loss_diff": diff, "args": vars(args)}
        args.json.write_text(json.dumps(record, indent=1, default=str))


if __name__ == "__main__":
    main()
