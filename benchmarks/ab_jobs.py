"""Interleaved A/B timing of the same short workload under several ways of running it (one process, one machine).

    python benchmarks/ab_jobs.py --rounds 3 --steps 60             # the default variants below
    python benchmarks/ab_jobs.py --variants seq2,par1 --jobs 2     # a subset
    python benchmarks/ab_jobs.py --sweep --steps 100 --rounds 2    # the main job itself, shortened, per launcher

Each variant trains `--jobs` tiny models (`model=tiny train=quick`, `--steps` steps, pos=rope and alibi alternating)
with `posenc train` in fresh processes, the way the main job's jobs run:

- seq2: one job after another, each with 2 threads (today's basic launcher);
- par1: all jobs at once, each with 1 thread (a joblib launcher with n_jobs = jobs);
- `...-fp32` / `...-bf16`: the same with `train.precision` fixed instead of `auto`.

With `--sweep` the workload is the main job (`posenc sweep extrapolation`) with `train.steps=--steps` and a
fine-tune of `--steps // 4` steps, under the launchers of `SWEEP_VARIANTS` (basic: one job after another with all
threads; joblib-N: N jobs at a time, posenc giving each cores ÷ N threads).

Rounds alternate the variant order (A B C, C B A, ...) so drift on a shared machine hits every variant alike; the
report gives each round's time relative to the first variant of that round, then the median ratio, which moves much
less than the absolute seconds when other work shares the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS: dict[str, tuple[str, int, str]] = {  # name -> (mode, threads per job, precision)
    "seq2": ("seq", 2, "auto"),
    "par1": ("par", 1, "auto"),
    "seq2-fp32": ("seq", 2, "fp32"),
    "par1-fp32": ("par", 1, "fp32"),
}


SWEEP_VARIANTS: dict[str, list[str]] = {
    "basic": [],
    "joblib-2": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
    "joblib-5": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=5"],
}


def run_sweep_variant(name: str, steps: int, scratch: Path) -> float:
    """Wall seconds of the shortened main job under launcher variant `name` (a fresh sweep directory each time)."""
    out = scratch / f"sweep-{name}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "posenc_cli", "sweep", "extrapolation", f"train.steps={steps}"]
    cmd += [f"extend.finetune_steps=0,{max(1, steps // 4)}", *SWEEP_VARIANTS[name], "--out", str(out)]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def job_command(out: Path, pos: str, steps: int, threads: int, precision: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "posenc_cli",
        "train",
        "model=tiny",
        "train=quick",
        f"pos={pos}",
        f"train.steps={steps}",
        f"train.threads={threads}",
        f"train.precision={precision}",
        "--out",
        str(out),
    ]


def run_variant(name: str, jobs: int, steps: int, scratch: Path) -> float:
    """Wall seconds to train `jobs` fresh runs the way variant `name` does."""
    mode, threads, precision = VARIANTS[name]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    outs = [scratch / f"{name}-{i}" for i in range(jobs)]
    for out in outs:
        shutil.rmtree(out, ignore_errors=True)
    cmds = [job_command(out, ("rope", "alibi")[i % 2], steps, threads, precision) for i, out in enumerate(outs)]
    start = time.perf_counter()
    if mode == "seq":
        for cmd in cmds:
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    else:
        procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL) for cmd in cmds]
        for proc in procs:
            if proc.wait() != 0:
                raise SystemExit(f"{name}: a job failed")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=None, help="Comma-separated (default: all of the mode's variants).")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--sweep", action="store_true", help="Time the shortened main job per launcher instead.")
    args = parser.parse_args(argv)
    known = SWEEP_VARIANTS if args.sweep else VARIANTS
    names = [n.strip() for n in (args.variants or ",".join(known)).split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown variant {unknown[0]} (known: {', '.join(known)})")
    seconds: dict[str, list[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="posenc-ab-") as tmp:
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                if args.sweep:
                    seconds[name].append(run_sweep_variant(name, args.steps, Path(tmp)))
                else:
                    seconds[name].append(run_variant(name, args.jobs, args.steps, Path(tmp)))
                print(f"round {r + 1} {name}: {seconds[name][-1]:.1f} s", flush=True)
    base = names[0]
    ratios = {n: [v / b for v, b in zip(seconds[n], seconds[base], strict=True)] for n in names}
    what = "main job" if args.sweep else f"{args.jobs} jobs"
    print(f"\n{what}, {args.steps} steps, {args.rounds} rounds; time relative to {base} (per round, median)")
    for n in names:
        per_round = " ".join(f"{x:.2f}" for x in ratios[n])
        print(f"  {n:10s} {per_round}   median {statistics.median(ratios[n]):.2f}")
    if args.json:
        args.json.write_text(json.dumps({"seconds": seconds, "ratios": ratios, "args": vars(args)}, default=str))


if __name__ == "__main__":
    main()
