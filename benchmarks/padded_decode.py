"""eval-algorithmic's decoding of a cell: one prompt length at a time against every length in one left-padded batch.

    nice -n 5 python benchmarks/padded_decode.py RUN --lengths 1,4,8,12,16 --examples 32 --rounds 2

For every task × instance length of RUN (the tasks of its `data=algorithmic` mixture, or `--tasks`), the cell's
examples are encoded with the run's tokenizer and their answers decoded greedily through the KV cache twice, in one
process, alternating for `--rounds` rounds: "by length" (what eval-algorithmic did before issue #42 item 3: one
`passkey.decode_prompts` call per prompt length, each its own batches) and "padded" (`passkey.decode_ragged`, the
cell's prompts left-padded into batches of `--batch-tokens`). It prints, per task and overall, the decode calls and
the wall time of each (the least over rounds), their ratio, and the rows whose generated tokens differ (none
expected). Only the decoding is timed (examples, encoding and scoring are the same for both). One torch thread.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from posenc_cli.evaluation import passkey
from posenc_cli.evaluation.algorithmic import (
    AlgorithmicEvalConfig,
    cell_examples,
    decode_plan,
    encode_example,
    plan_for,
)
from posenc_cli.run.load import load_run

Cell = tuple[str, int, list[np.ndarray], list[int]]  # task, length, prompts, answer lengths


def counted_calls(decode):  # type: ignore[no-untyped-def]
    """`decode(...)` -> (its result, the `passkey.greedy_decode` calls it made: one per batch)."""

    def run(*args):  # type: ignore[no-untyped-def]
        calls = 0
        inner = passkey.greedy_decode

        def counted(*a, **k):  # type: ignore[no-untyped-def]
            nonlocal calls
            calls += 1
            return inner(*a, **k)

        passkey.greedy_decode = counted
        try:
            return decode(*args), calls
        finally:
            passkey.greedy_decode = inner

    return run


@counted_calls
def by_length(model: torch.nn.Module, cell: Cell, batch_tokens: int) -> list[np.ndarray]:
    """Generated tokens per row: one `decode_prompts` per prompt width, as before the padded batches."""
    _, _, prompts, answers = cell
    out: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(prompts)
    by_width: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_width.setdefault(len(p), []).append(i)
    for width, rows in sorted(by_width.items()):
        steps = max(answers[i] for i in rows)
        batch = np.stack([prompts[i] for i in rows])  # (n, width)
        generated = passkey.decode_prompts(model, batch, steps, width + steps, batch_tokens, "fp32", "cpu", None, "")
        for r, i in enumerate(rows):
            out[i] = generated[r]
    return out


@counted_calls
def padded(model: torch.nn.Module, cell: Cell, batch_tokens: int) -> list[np.ndarray]:
    """Generated tokens per row: `decode_ragged` over the whole cell, as eval-algorithmic now decodes."""
    _, _, prompts, answers = cell
    steps, _ = decode_plan([len(p) for p in prompts], answers, None)
    cells = [len(p) + s for p, s in zip(prompts, steps, strict=True)]
    return passkey.decode_ragged(model, prompts, steps, cells, batch_tokens, "fp32", "cpu", None, "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run")
    parser.add_argument("--tasks", default=None, help="comma-separated tasks (default: the run's)")
    parser.add_argument("--lengths", default=None, help="comma-separated instance lengths (default: 1..2L)")
    parser.add_argument("--examples", type=int, default=32)
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--rounds", type=int, default=2)
    ns = parser.parse_args()
    torch.set_num_threads(1)
    run = load_run(ns.run)
    model, tokenizer = run.model, run.tokenizer
    cfg = AlgorithmicEvalConfig(
        tasks=ns.tasks.split(",") if ns.tasks else None,
        lengths=[int(n) for n in ns.lengths.split(",")] if ns.lengths else None,
        examples=ns.examples,
    )
    plan = plan_for(cfg, run.config.data)
    cells: list[Cell] = []
    for task in plan.tasks:
        for n in plan.lengths:
            examples = cell_examples(task, n, plan.examples, 0, plan.least[task])
            if any(e.scored is not None for e in examples):
                continue  # teacher-forced tasks decode nothing
            encoded = [encode_example(tokenizer, e) for e in examples]
            if max(len(p) + len(a) for p, a in encoded) - 1 > (getattr(model.scheme, "max_length", None) or 1 << 30):
                continue
            cells.append((task, n, [p for p, _ in encoded], [len(a) for _, a in encoded]))
    modes = {"by length": by_length, "padded": padded}
    best: dict[tuple[str, str], float] = {}
    calls: dict[tuple[str, str], int] = {}
    outputs: dict[str, list[list[np.ndarray]]] = {}
    for _ in range(ns.rounds):
        for mode, decode in modes.items():
            seconds: dict[str, float] = {}
            outs = []
            for cell in cells:
                start = time.perf_counter()
                out, n_calls = decode(model, cell, ns.batch_tokens)
                seconds[cell[0]] = seconds.get(cell[0], 0.0) + time.perf_counter() - start
                calls[cell[0], mode] = calls.get((cell[0], mode), 0) + n_calls
                outs.append(out)
            outputs[mode] = outs
            for task, s in seconds.items():
                best[task, mode] = min(best.get((task, mode), float("inf")), s)
    differ = sum(
        not np.array_equal(a, b)
        for old, new in zip(outputs["by length"], outputs["padded"], strict=True)
        for a, b in zip(old, new, strict=True)
    )
    widths = np.mean([len({len(p) for p in c[2]}) for c in cells])
    print(f"run {ns.run}: pos={run.config.pos.name}, {len(cells)} cells × {plan.examples} examples, "
          f"{widths:.1f} prompt lengths per cell on average, fp32, 1 thread, least of {ns.rounds} rounds")  # fmt: skip
    print(f"{'task':20s} {'calls (by length)':>18s} {'calls (padded)':>15s} {'s (by length)':>14s} "
          f"{'s (padded)':>11s} {'ratio':>6s}")  # fmt: skip
    total = {mode: 0.0 for mode in modes}
    for task in dict.fromkeys(c[0] for c in cells):
        old, new = best[task, "by length"], best[task, "padded"]
        total["by length"] += old
        total["padded"] += new
        print(f"{task:20s} {calls[task, 'by length'] // ns.rounds:18d} {calls[task, 'padded'] // ns.rounds:15d} "
              f"{old:14.2f} {new:11.2f} {old / new:6.2f}")  # fmt: skip
    old, new = total["by length"], total["padded"]
    print(f"{'all':20s} {'':18s} {'':15s} {old:14.2f} {new:11.2f} {old / new:6.2f}")
    print(f"rows whose generated tokens differ: {differ}")


if __name__ == "__main__":
    main()
