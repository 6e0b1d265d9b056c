"""Interleaved A/B of the main job's inner loops in one process, timed in CPU seconds on one thread.

    python benchmarks/ab_step.py --rounds 7             # model=tiny train=quick: fp32 vs bf16 train step, eval forward

On one thread a case's CPU time is its own work, so other processes sharing the machine change it far less than
wall time (they still share caches and clocks, hence interleaved rounds and ratios within a round). Cases:

- train-<pos>-<dtype>: one `posenc train` step (autocast forward, loss, backward, clip, fused AdamW) of model=tiny
  at train.seq_len=128, batch 16;
- eval-<pos>-<dtype>-L<n>: one evaluation forward of 16,384 tokens at length n (as eval-extrapolate batches it).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch


def cpu_timed(fn: Callable[[], object], repeats: int) -> float:
    start = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - start) / repeats


def train_cases(pos: str, dtypes: list[str]) -> dict[str, Callable[[], float]]:
    from posenc_cli.perf.bench import posenc_train_case
    from posenc_cli.run.config_compose import compose_config

    cfg = compose_config(["model=tiny", "train=quick", f"pos={pos}", "train.device=cpu"])
    out = {}
    for dtype in dtypes:
        case = posenc_train_case(cfg, 257, torch.device("cpu"), dtype)
        for _ in range(3):
            case.step()  # warm-up
        out[f"train-{pos}-{dtype}"] = lambda case=case: cpu_timed(case.step, 5)
    return out


def eval_cases(pos: str, dtypes: list[str], length: int, tokens: int = 16384) -> dict[str, Callable[[], float]]:
    from posenc_cli.model import build_model
    from posenc_cli.run.config_compose import compose_config

    cfg = compose_config(["model=tiny", "train=quick", f"pos={pos}"])
    torch.manual_seed(0)
    model = build_model(cfg, 257).eval()
    x = torch.randint(0, 257, (max(1, tokens // length), length))
    out = {}
    for dtype in dtypes:

        def forward(dtype: str = dtype) -> None:
            with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=dtype == "bf16"):
                model(x)

        forward()
        out[f"eval-{pos}-{dtype}-L{length}"] = lambda forward=forward: cpu_timed(forward, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pos", default="rope,alibi")
    parser.add_argument("--lengths", default="128,2048")
    parser.add_argument("--no-eval", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dtypes = ["fp32", "bf16"]
    cases: dict[str, Callable[[], float]] = {}
    for pos in args.pos.split(","):
        cases |= train_cases(pos, dtypes)
        if not args.no_eval:
            for length in (int(n) for n in args.lengths.split(",")):
                cases |= eval_cases(pos, dtypes, length)
    values: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            values[name].append(cases[name]())
    print(f"{args.rounds} rounds, 1 thread, CPU seconds (median) and bf16/fp32 per round (median)")
    for name in names:
        if not name.endswith("fp32") and "-fp32-" not in name:
            continue
        other = name.replace("fp32", "bf16")
        ratio = statistics.median(b / a for a, b in zip(values[name], values[other], strict=True))
        print(
            f"  {name:24s} fp32 {statistics.median(values[name]) * 1e3:8.1f} ms   "
            f"bf16 {statistics.median(values[other]) * 1e3:8.1f} ms   bf16/fp32 {ratio:.2f}"
        )


if __name__ == "__main__":
    main()
