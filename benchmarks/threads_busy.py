"""Training tokens/s on a machine with one busy core: posenc's default threads against explicit settings (issue #42).

    python benchmarks/threads_busy.py --steps 60 --rounds 2          # starts a spinning process on one core
    python benchmarks/threads_busy.py --no-spin --warmup 0           # the machine is busy already

A spinning child process (a busy loop) takes one core; after `--warmup` seconds, long enough for the 1-minute load
average posenc reads (`posenc_cli/cpu_load.py`) to count it, each variant trains a fresh `model=tiny train=quick`
RoPE run in its own `posenc train` process, alternating the variant order round by round:

- default: `train.threads=0`, posenc's default (the free cores);
- all cores: `train.threads=<cores>`, what torch's default takes (the old default);
- 1: `train.threads=1`.

It prints each variant's training tokens/s (meta.json's `tokens_per_s`, median over rounds), its ratio to the best
variant, and the threads the default chose (meta.json's `threads`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def train(out: Path, steps: int, threads: int) -> tuple[float, int]:
    """(tokens/s, threads used) of one fresh training run in its own process."""
    cmd = [sys.executable, "-m", "posenc_cli", "train", "model=tiny", "train=quick", "pos=rope"]
    cmd += [f"train.steps={steps}", f"train.threads={threads}", "train.precision=fp32", "--out", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    meta = json.loads((out / "meta.json").read_text())
    return float(meta["tokens_per_s"]), int(meta["threads"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=90.0, help="seconds between starting the spinner and timing")
    parser.add_argument("--no-spin", action="store_true", help="start no spinning process")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    variants = {"default": 0, "all cores": cores, "1": 1}
    spinner = None if args.no_spin else subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(args.warmup)
        print(f"{cores} cores, load average {os.getloadavg()[0]:.1f} before timing, {args.steps} steps, fp32")
        speeds: dict[str, list[float]] = {name: [] for name in variants}
        chosen: list[int] = []
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                order = list(variants) if r % 2 == 0 else list(variants)[::-1]
                for name in order:
                    tokens_per_s, used = train(Path(tmp) / f"{r}-{name.replace(' ', '_')}", args.steps, variants[name])
                    speeds[name].append(tokens_per_s)
                    if name == "default":
                        chosen.append(used)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    medians = {name: statistics.median(v) for name, v in speeds.items()}
    best = max(medians.values())
    for name, value in medians.items():
        note = f"  (chose {', '.join(map(str, chosen))} thread(s))" if name == "default" else ""
        print(f"  {name:<10} {value:10,.0f} tokens/s  {value / best:5.2f}x the best{note}")


if __name__ == "__main__":
    main()
