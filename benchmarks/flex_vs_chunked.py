"""FlexAttention vs today's road for every scheme that offers a `score_mod`: time and peak memory, side by side.

    python benchmarks/flex_vs_chunked.py                            # cpu, 8k and 32k tokens, every flex scheme
    python benchmarks/flex_vs_chunked.py --device cuda --json flex_cuda.json
    python benchmarks/flex_vs_chunked.py --lengths 8192 --schemes t5,fire --span sliding:1024

One attention call of model=tiny's shape (batch 1, 4 heads × 32 dims, fp32, no gradient: PyTorch 2.13 has no
FlexAttention backward on CPU) on random q, k, v, a fresh `AttentionState` per call: "today" is the road
`choose_kernel` picks by default (the key-bias road for ALiBi on CPU, the chunked bias path or the shared mask
otherwise), "flex" the `Flex` kernel (torch.compile(flex_attention)) called directly, whatever `choose.FLEX_MIN_LEN`
says. Each (scheme, length, road) runs in its own process: `--repeats` timed calls (the fastest is reported), after
one untimed call for flex (it compiles the kernel) and on CUDA. Peak memory is the timed calls' own: on CPU the growth
of the resident set over its level before them (VmHWM after resetting it through /proc/self/clear_refs), on CUDA
`max_memory_allocated` over the allocation before. The parent compares the two roads' outputs (max |difference|;
the key-bias road's own rounding is ~eps·max|bias|, see `kernels.KeyBias`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from posenc_cli.attention import Flex, choose, choose_kernel, describe
from posenc_cli.attention.state import AttentionState
from posenc_cli.config import ModelConfig
from posenc_cli.positional import PositionalScheme, PositionContext, build_scheme, config_class, registry
from posenc_cli.positional.span import FULL, Span

TINY_ATTENTION = ModelConfig(d_model=128, n_layer=1, n_head=4)  # model=tiny's heads: 4 × 32
TRAIN_LENGTH = 128  # train.seq_len's default


def flex_schemes() -> list[str]:
    return [n for n, cls in sorted(registry().items()) if cls.score_mod is not PositionalScheme.score_mod]


def resident_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def run_case(name: str, length: int, road: str, device: str, repeats: int, span: Span, out: Path) -> dict:
    """One (scheme, length, road) in this process: seconds (fastest call), peak MiB of the timed calls, the kernel."""
    torch.manual_seed(0)
    scheme = build_scheme(config_class(name)(), TINY_ATTENTION, TRAIN_LENGTH).to(device)
    ctx = PositionContext(positions=torch.arange(length, device=device))
    scheme.prepare(ctx)
    shape = (1, TINY_ATTENTION.n_head, length, TINY_ATTENTION.head_dim)
    q, k, v = (torch.randn(shape, device=device) for _ in range(3))
    spec = describe(AttentionState(scheme, ctx), q, span=span)
    if road == "today":  # the road before FlexAttention: the policy without it
        choose.FLEX_MIN_LEN = {}
    kernel = Flex(span=spec.span) if road == "flex" else choose_kernel(spec)  # flex: whatever the policy says

    def call() -> torch.Tensor:
        with torch.no_grad():
            y = kernel(q, k, v, AttentionState(scheme, ctx), 0)  # a fresh state per call, as per forward
        if device == "cuda":
            torch.cuda.synchronize()
        return y

    first = None
    if road == "flex" or device == "cuda":  # compiles the flex kernel, starts CUDA (today's CPU roads: no warm-up)
        start = time.perf_counter()
        call()
        first = time.perf_counter() - start
        print(json.dumps({"first_s": first, "kernel": type(kernel).__name__}), flush=True)  # kept if timed out
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        base = resident_kib("VmRSS") * 1024
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        y = call()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else resident_kib("VmHWM") * 1024
    torch.save(y.cpu(), out)
    return {"seconds": min(times), "peak_mib": (peak - base) / 2**20, "kernel": type(kernel).__name__, "first_s": first}


def spawn(name: str, length: int, road: str, args: argparse.Namespace, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--case", f"{name},{length},{road},{out}", "--device", args.device]
    cmd += ["--repeats", str(args.repeats), "--span", args.span]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        partial = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        return {**partial, "error": f"over {args.timeout:.0f} s"}
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_span(text: str) -> Span:
    if text == "full":
        return FULL
    kind, size = text.split(":")
    return Span(kind, int(size))  # type: ignore[arg-type]


def cpu_name() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="8192,32768")
    p.add_argument("--schemes", default=",".join(flex_schemes()))
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--span", default="full", help="full, sliding:W or chunked:C")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per case")
    p.add_argument("--roads", default="today,flex", help="today, flex or both")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    span = parse_span(args.span)
    if args.case:
        name, length, road, out = args.case.split(",")
        print(json.dumps(run_case(name, int(length), road, args.device, args.repeats, span, Path(out))))
        return
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else cpu_name()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"# {device_name}, torch {torch.__version__}, fp32, threads {torch.get_num_threads()}, span {args.span}")
    print(f"# load average before: {load}")
    print("| scheme | T | today: kernel | today s | today MiB | flex s | flex MiB | flex/today time | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for length in (int(x) for x in args.lengths.split(",")):
            for name in args.schemes.split(","):
                files = {r: Path(tmp) / f"{name}-{length}-{r}.pt" for r in ("today", "flex")}
                roads = args.roads.split(",")
                a, b = (spawn(name, length, r, args, files[r]) if r in roads else {"error": "not run"} for r in files)
                diff = None
                if "error" not in a and "error" not in b:
                    diff = float((torch.load(files["today"]) - torch.load(files["flex"])).abs().max())
                rows.append({"scheme": name, "length": length, "today": a, "flex": b, "max_abs_diff": diff})
                print(row_text(rows[-1]), flush=True)
    if args.json:
        meta = {"device": device_name, "torch": torch.__version__, "span": args.span, "cpus": os.cpu_count()}
        meta["load_average_after"] = list(os.getloadavg())
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


def row_text(row: dict) -> str:
    a, b = row["today"], row["flex"]

    def cells(r: dict) -> str:
        if "error" in r:
            first = f" (first call {r['first_s']:.0f} s)" if r.get("first_s") else ""
            return f"{r['error']}{first} |"
        return f"{r['seconds']:.3f} | {r['peak_mib']:.1f}"

    ratio = f"{b['seconds'] / a['seconds']:.2f}" if "error" not in a and "error" not in b else ""
    diff = "" if row["max_abs_diff"] is None else f"{row['max_abs_diff']:.1e}"
    kernel = a.get("kernel", "")
    return f"| {row['scheme']} | {row['length']} | {kernel} | {cells(a)} | {cells(b)} | {ratio} | {diff} |"


if __name__ == "__main__":
    main()
