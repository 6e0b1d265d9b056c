"""Benchmark the core positional schemes on model=small (d=256, 6 layers, 8 heads).

    python benchmarks/bench_schemes.py --threads 2              # full run
    python benchmarks/bench_schemes.py --threads 2 --quick      # short run (fewer steps, 4096-token memory case)

Reports (1) forward+backward training throughput in tokens/s for every registered scheme, fp32 and bf16 autocast,
and (2) the peak resident memory (VmHWM, else ru_maxrss) of one long evaluation forward under `torch.inference_mode`,
for ALiBi (bias hook) and NoPE (fused causal SDPA), each case in its own subprocess (`posenc_cli.perf.bench`, which
`posenc bench` also uses; that command adds the transformers baseline, MFU and more lengths).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from posenc_cli.config import ModelConfig
from posenc_cli.model import GPT
from posenc_cli.perf.bench import EvalCase, spawn_eval_case
from posenc_cli.positional import config_class, registry

SMALL = ModelConfig(d_model=256, n_layer=6, n_head=8)
VOCAB = 256


def throughput(name: str, seq_len: int, batch: int, steps: int, bf16: bool, warmup: int = 1) -> float:
    """Tokens/s of forward + backward (no optimizer step) on random tokens, after `warmup` untimed steps."""
    torch.manual_seed(0)
    model = GPT(SMALL, config_class(name)(), VOCAB, seq_len)
    x = torch.randint(0, VOCAB, (batch, seq_len))
    y = torch.randint(0, VOCAB, (batch, seq_len))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        model.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * batch * seq_len / (time.perf_counter() - start)


def run_memory_case(name: str, length: int, threads: int) -> dict[str, float]:
    """One batch-1 forward of `length` tokens in a fresh process (`posenc_cli.perf.bench.spawn_eval_case`)."""
    case = EvalCase(
        model=asdict(SMALL),
        pos=name,
        vocab_size=VOCAB,
        train_length=128,
        length=length,
        batch=1,
        precision="fp32",
        device="cpu",
        threads=threads,
        repeats=1,
    )
    r = spawn_eval_case(case)
    return {"baseline_mib": r["base_mem_mb"], "peak_mib": r["peak_mem_mb"], "seconds": r["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--long", type=int, default=None, help="length of the memory cases (8192; --quick: 4096)")
    parser.add_argument("--quick", action="store_true", help="1 timed step, memory cases at 4096 tokens")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    steps = 1 if args.quick else args.steps
    long = args.long or (4096 if args.quick else 8192)
    console = Console()
    console.print(
        f"model=small (d=256, 6 layers, 8 heads), vocab {VOCAB}, T={args.seq_len}, batch {args.batch}, "
        f"{steps} timed steps, {args.threads} threads, torch {torch.__version__}",
        highlight=False,
    )

    speed = Table(title="Forward + backward throughput (tokens/s)")
    for col in ("scheme", "fp32", "bf16 autocast", "fp32 vs nope"):
        speed.add_column(col, justify="right" if col != "scheme" else "left")
    results = {}
    for name in registry():
        results[name] = tuple(throughput(name, args.seq_len, args.batch, steps, bf16) for bf16 in (False, True))
        print(f"{name}: fp32 {results[name][0]:,.0f} tok/s, bf16 {results[name][1]:,.0f} tok/s", file=sys.stderr)
    ref = results.get("nope", (None, None))[0]
    for name, (fp32, bf16) in results.items():
        rel = f"{fp32 / ref:.2f}x" if ref else "-"
        speed.add_row(name, f"{fp32:,.0f}", f"{bf16:,.0f}", rel)
    console.print(speed)

    mem = Table(title=f"Peak resident memory, one {long}-token forward (batch 1, inference_mode, own process)")
    for col in ("scheme", "baseline MiB", "peak MiB", "seconds"):
        mem.add_column(col, justify="right" if col != "scheme" else "left")
    for name in ("alibi", "nope"):
        r = run_memory_case(name, long, args.threads)
        print(f"{name} at {long} tokens: peak {r['peak_mib']:.0f} MiB", file=sys.stderr)
        mem.add_row(name, f"{r['baseline_mib']:.0f}", f"{r['peak_mib']:.0f}", f"{r['seconds']:.1f}")
    console.print(mem)


if __name__ == "__main__":
    main()
