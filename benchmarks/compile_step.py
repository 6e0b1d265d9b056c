"""Compiled vs eager training steps (`train.compile`), interleaved in one process.

    python benchmarks/compile_step.py                          # model=tiny train=quick on this machine's device
    python benchmarks/compile_step.py --modes eager,default,reduce-overhead --device cuda --json out.json
    python benchmarks/compile_step.py --threads 1 --precision fp32 --rounds 5 train.batch_size=64

Each mode is one `posenc train` step (autocast forward, cross-entropy, backward, clip, AdamW: `perf.bench.train_case`)
of the same model and batch, the forward compiled as `train.compile=<mode>` makes it (`posenc_cli.run.compile`).
The first calls compile (their time is reported apart as compile_s); then each round times enough steps to last
about --round-s seconds, modes in alternating order (A B C, C B A, ...) so drift hits every mode alike. Reported:
median ms per step and tokens/s, and the speed relative to eager within each round (median).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch


def build_cases(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, float], dict[str, Any]]:
    from posenc_cli.model import build_model
    from posenc_cli.perf.bench import bench_vocab_size, calibrated, train_case, train_flops_per_token
    from posenc_cli.run import compile as compiling
    from posenc_cli.run.config_compose import compose_config
    from posenc_cli.run.device import resolve_device, resolve_precision

    device = resolve_device(args.device, "--device")
    overrides = [f"model={args.model}", "train=quick", f"pos={args.pos}", f"train.device={device.type}"]
    cfg = compose_config([*overrides, *args.overrides])
    precision = resolve_precision(args.precision, device)
    vocab = bench_vocab_size(cfg)
    probes, compile_s = {}, {}
    for mode in args.modes:
        value: bool | str = False if mode == "eager" else mode
        compiling.check_compile(value, device)
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg, vocab).to(device)
        mode_name = compiling.compile_mode(value)  # as train.compile does, without resetting the other modes' caches
        compiled = model if mode_name is None else torch.compile(model, mode=mode_name, backend=compiling.BACKEND)

        def forward(x: torch.Tensor, compiled: Any = compiled, value: bool | str = value) -> torch.Tensor:
            compiling.step_begin(value, device)
            return compiled(x)

        m = cfg.model
        flops = train_flops_per_token(model.num_parameters(), m.n_layer, m.d_model, cfg.train.seq_len)
        case = train_case(model, forward, cfg.train, vocab, device, precision, flops)
        start = time.perf_counter()
        case.step()  # compiles (eager: the first step's set-up)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        compile_s[mode] = time.perf_counter() - start
        probes[mode] = (calibrated(case, device, args.round_s, warmup=args.warmup), case.tokens_per_step)
    facts = {
        "device": str(device),
        "precision": precision,
        "threads": torch.get_num_threads(),
        "model": args.model,
        "pos": args.pos,
        "batch": cfg.train.batch_size,
        "seq_len": cfg.train.seq_len,
    }
    return probes, compile_s, facts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=None, help="Comma-separated: eager and torch.compile modes (default: "
                        "eager,default, and reduce-overhead on CUDA)")  # fmt: skip
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--pos", default="rope")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round-s", type=float, default=1.0)
    parser.add_argument("--warmup", type=int, default=5, help="steps after the first, before timing")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("overrides", nargs="*", help="more config overrides, e.g. train.batch_size=64")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.modes is None:
        cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        args.modes = "eager,default" + (",reduce-overhead" if cuda else "")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.modes[0] != "eager":
        args.modes.insert(0, "eager")
    probes, compile_s, facts = build_cases(args)
    tps: dict[str, list[float]] = {m: [] for m in args.modes}
    for r in range(args.rounds):
        for mode in args.modes if r % 2 == 0 else args.modes[::-1]:
            tps[mode].append(probes[mode][0]())
    tokens_per_step = probes["eager"][1]
    results = {}
    for mode in args.modes:
        ratio = statistics.median(a / b for a, b in zip(tps[mode], tps["eager"], strict=True))
        median = statistics.median(tps[mode])
        results[mode] = {
            "tokens_per_s": median,
            "ms_per_step": 1000 * tokens_per_step / median,
            "speed_vs_eager": ratio,
            "compile_s": compile_s[mode],
        }
    what = ", ".join(f"{k} {v}" for k, v in facts.items())
    print(f"train step, {what}; {args.rounds} interleaved rounds (median)")
    for mode, r in results.items():
        print(f"  {mode:28s} {r['ms_per_step']:8.2f} ms/step  {r['tokens_per_s']:10,.0f} tokens/s  "
              f"{r['speed_vs_eager']:.2f}x eager  (first step {r['compile_s']:.1f} s)")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"facts": facts, "results": results, "tokens_per_s": tps}, indent=1))


if __name__ == "__main__":
    main()
