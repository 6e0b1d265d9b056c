"""Packed rows against one example per row: the training step over the same examples, interleaved in one process.

    python benchmarks/packing_step.py --rounds 7                 # model=tiny, copy lengths 1-8, seq_len 48
    python benchmarks/packing_step.py --seq-len 256 --max-length 40   # longer rows: packed rows attend by chunks

The examples are the algorithmic `copy` task's (`Copy: a 7 Q [SEP] a 7 Q`, UTF-8 bytes as tokens, lengths drawn
uniformly from 1..8, `--max-length`), `--examples` of them, the same for every case. Each case runs a training step
over all of them (forward, the loss on the real tokens, backward, AdamW) on model=tiny at seq_len 48 (`--seq-len`),
in fp32 on one thread, timed in CPU seconds (as benchmarks/ab_step.py; other processes on a shared machine change
CPU time far less than wall time):

- `padded`: one example per row from position 0, padded to the row length; no document mask (trailing pads come
  after every real token, so causality already hides them);
- `padded+mask`: the same rows with `documents` (pads as documents of their own), what a pad mask adds;
- `packed`: the examples packed first-fit in order into rows of that length (`documents`, position ids from 0 per
  example, trailing pads), so fewer rows of the same length.

Printed: each case's median CPU seconds and, per round, its time over `padded`'s (median), per scheme.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

SEQ_LEN = 48  # --seq-len sets it


def copy_examples(n: int, seed: int, lengths: tuple[int, int] = (1, 8)) -> list[list[int]]:
    """n copy examples (prompt and answer) as byte tokens, each at most SEQ_LEN + 1 long (inputs and targets)."""
    from posenc_cli.data.algorithmic.copy import Copy

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ex = Copy.sample(rng, int(rng.integers(lengths[0], lengths[1] + 1)))
        out.append(list((ex.prompt + ex.answer).encode())[: SEQ_LEN + 1])
    return out


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]


def padded(examples: list[list[int]], mask: bool) -> Batch:
    """(inputs, targets, documents, position ids, scored) rows of one example each, padded to SEQ_LEN."""
    B = len(examples)
    x = torch.zeros(B, SEQ_LEN, dtype=torch.long)
    y = torch.zeros(B, SEQ_LEN, dtype=torch.long)
    docs = torch.full((B, SEQ_LEN), -1)
    scored = torch.zeros(B, SEQ_LEN, dtype=torch.bool)
    for b, ex in enumerate(examples):
        n = len(ex) - 1
        x[b, :n], y[b, :n] = torch.tensor(ex[:-1]), torch.tensor(ex[1:])
        docs[b, :n], scored[b, :n] = 0, True
    return x, y, docs if mask else None, None, scored


def packed(examples: list[list[int]]) -> Batch:
    """The examples first-fit in order into rows of SEQ_LEN: documents, position ids from 0 per example."""
    rows: list[list[list[int]]] = []
    for ex in examples:
        for row in rows:
            if sum(len(e) - 1 for e in row) + len(ex) - 1 <= SEQ_LEN:
                row.append(ex)
                break
        else:
            rows.append([ex])
    B = len(rows)
    x = torch.zeros(B, SEQ_LEN, dtype=torch.long)
    y = torch.zeros(B, SEQ_LEN, dtype=torch.long)
    docs = torch.full((B, SEQ_LEN), -1)
    ids = torch.zeros(B, SEQ_LEN, dtype=torch.long)
    scored = torch.zeros(B, SEQ_LEN, dtype=torch.bool)
    for b, row in enumerate(rows):
        s = 0
        for d, ex in enumerate(row):
            n = len(ex) - 1
            x[b, s : s + n], y[b, s : s + n] = torch.tensor(ex[:-1]), torch.tensor(ex[1:])
            docs[b, s : s + n], ids[b, s : s + n], scored[b, s : s + n] = d, torch.arange(n), True
            s += n
    return x, y, docs, ids, scored


def step_case(pos: str, batch: Batch) -> Callable[[], float]:
    from posenc_cli.model import build_model
    from posenc_cli.run.config_compose import compose_config

    cfg = compose_config(["model=tiny", f"pos={pos}", f"train.seq_len={SEQ_LEN}"])
    torch.manual_seed(0)
    model = build_model(cfg, 257)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y, docs, ids, scored = batch

    def step() -> None:
        logits = model(x, position_ids=ids, documents=docs)  # (B, T, V)
        loss = F.cross_entropy(logits[scored], y[scored])  # the real tokens only
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(2):
        step()  # warm-up

    def timed() -> float:
        start = time.process_time()
        step()
        return time.process_time() - start

    return timed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pos", default="rope,alibi,t5,fox")
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seq-len", type=int, default=48)
    parser.add_argument("--max-length", type=int, default=8, help="longest copy example (symbols)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    global SEQ_LEN
    SEQ_LEN = args.seq_len
    examples = copy_examples(args.examples, args.seed, (1, args.max_length))
    batches = {"padded": padded(examples, False), "padded+mask": padded(examples, True), "packed": packed(examples)}
    real = sum(len(e) - 1 for e in examples)
    print(
        f"{len(examples)} copy examples, {real} tokens; rows of {SEQ_LEN}: "
        + ", ".join(f"{k} {v[0].shape[0]}" for k, v in batches.items())
    )
    print(f"{args.rounds} rounds, 1 thread, fp32, CPU seconds per step over all examples (median), / padded (median)")
    for pos in args.pos.split(","):
        cases = {name: step_case(pos, batch) for name, batch in batches.items()}
        values: dict[str, list[float]] = {name: [] for name in cases}
        for r in range(args.rounds):
            for name in list(cases) if r % 2 == 0 else list(cases)[::-1]:
                values[name].append(cases[name]())
        for name, times in values.items():
            ratio = statistics.median(t / p for t, p in zip(times, values["padded"], strict=True))
            print(f"  {pos:14s} {name:12s} {statistics.median(times) * 1e3:8.1f} ms   / padded {ratio:.2f}")


if __name__ == "__main__":
    main()
