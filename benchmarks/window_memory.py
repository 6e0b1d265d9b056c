"""Peak extra memory of one evaluation forward of windowed, chunked and packed (document) layouts, by length.

    nice -n 5 python benchmarks/window_memory.py                       # every case at 4,096 / 8,192 / 32,768 / 65,536
    nice -n 5 python benchmarks/window_memory.py --cases sliding --lengths 32768 --no-flex
    nice -n 5 python benchmarks/window_memory.py --cases sliding --lengths 65536 --forwards 1 --timeout 3000

Each (case, length) runs in a fresh process: a tiny model (d_model 64, 2 layers, 2 heads, vocabulary 64), fp32,
batch 1, `torch.no_grad`, one thread, random tokens. The measure is the process's resident set: its peak (VmHWM,
reset through /proc/self/clear_refs just before the forward) minus its resident size just before the forward, for
the first forward (which includes FlexAttention's compile where that road is taken) and for a second one. torch's
CPU tensors are not seen by tracemalloc, hence the resident set. The roads each forward took are listed (the kernel
classes `choose.choose_kernel` returned).

Cases (`pos.layers`, repeated over the 2 layers; windows of 1,024 tokens):
- sliding: ALiBi with a sliding window, then full ALiBi (the layout of issue #40: FlexAttention's block mask from
  32,768 tokens in fp32 on CPU, where a C++ compiler is found);
- chunked: RoPE in chunks, then NoPE (Llama 4's iRoPE pattern, the block-causal road);
- documents: the sliding case on packed rows, documents of 3,000 tokens (the document block mask).
`--no-flex` empties `choose.FLEX_MIN_LEN`, so the windowed ALiBi layers take the chunked `Windowed` road instead.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WINDOW = 1024
DOCUMENT = 3000
CASES: dict[str, list[dict[str, Any]]] = {
    "sliding": [{"name": "alibi", "span": "sliding", "window": WINDOW}, {"name": "alibi"}],
    "chunked": [{"name": "rope", "span": "chunked", "window": WINDOW}, {"name": "nope"}],
    "documents": [{"name": "alibi", "span": "sliding", "window": WINDOW}, {"name": "alibi"}],
}
LENGTHS = (4096, 8192, 32768, 65536)


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak() -> bool:
    """Reset VmHWM to the current resident size (Linux: `5` to /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def measure(case: str, length: int, no_flex: bool, forwards: int = 2) -> dict[str, Any]:
    """One case in this process: the model, then `forwards` forwards (1 or 2), each with its peak over the resident
    size before."""
    import torch

    from posenc_cli.attention import choose
    from posenc_cli.config import ModelConfig
    from posenc_cli.model import GPT
    from posenc_cli.positional.layout import LayoutConfig

    torch.set_num_threads(1)
    if no_flex:
        choose.FLEX_MIN_LEN = {}
    roads: list[str] = []
    original = choose.choose_kernel

    def spy(spec: Any) -> Any:
        kernel = original(spec)
        roads.append(type(kernel).__name__ + (f"({type(kernel.inner).__name__})" if hasattr(kernel, "inner") else ""))
        return kernel

    choose.choose_kernel = spy
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=64, n_layer=2, n_head=2), LayoutConfig(layers=CASES[case]), 64, 4096).eval()
    idx = torch.randint(0, 64, (1, length))
    documents = torch.arange(length)[None] // DOCUMENT if case == "documents" else None
    out: dict[str, Any] = {"case": case, "length": length, "no_flex": no_flex}
    for run in ("first", "second")[:forwards]:
        gc.collect()
        before = status_kib("VmRSS")
        reset = reset_peak()
        start = time.perf_counter()
        with torch.no_grad():
            logits = model(idx, documents=documents)
        seconds = time.perf_counter() - start
        peak = status_kib("VmHWM")
        del logits
        out[run] = {"extra_mib": (peak - before) / 1024, "seconds": seconds, "peak_reset": reset}
    out["roads"] = sorted(set(roads))
    out["rss_mib"] = status_kib("VmRSS") / 1024
    return out


def cpu_model() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Model name")), "unknown")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--no-flex", action="store_true", help="take the chunked roads instead of FlexAttention")
    parser.add_argument(
        "--forwards",
        type=int,
        choices=(1, 2),
        default=2,
        help="forwards per case (2: the second without FlexAttention's compile)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), args.no_flex, args.forwards)))
        return
    import torch

    print(f"CPU: {cpu_model()}; torch {torch.__version__}; fp32; batch 1; one thread; d_model 64, 2 layers, 2 heads")
    rows = []
    print("| case | tokens | extra MiB (1st forward) | s | extra MiB (2nd) | s | roads |")
    print("|---|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        for length in map(int, args.lengths.split(",")):
            cmd = [sys.executable, __file__, "--child", case, str(length), "--forwards", str(args.forwards)]
            cmd += ["--no-flex"] if args.no_flex else []
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"| {case} | {length:,} | timed out after {args.timeout:g} s | | | | |", flush=True)
                continue
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["?"])[-1]
                print(f"| {case} | {length:,} | failed: {tail} | | | | |", flush=True)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
            cells = [f"{row[run]['extra_mib']:,.0f} | {row[run]['seconds']:.1f}" if run in row else "– | –"
                     for run in ("first", "second")]  # fmt: skip
            cells.append(", ".join(row["roads"]))
            print(f"| {case} | {length:,} | " + " | ".join(cells) + " |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_model(), "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
