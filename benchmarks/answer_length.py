"""Where a run's copy or reverse answers go wrong beyond its training length: how many items it writes, and each
item when fed the right answer (docs/experiments/algorithmic.md, T5 at length 9).

    python benchmarks/answer_length.py RUN [RUN ...] --lengths 6-12 --examples 100 [--json answer_length.json]

For each run, each of its tasks that answers with a list of items (`copy`, `reverse`: " a 7 Q") and each length n,
on eval-algorithmic's prompts (`evaluation.algorithmic.cell_examples`, the same `--seed`):

- `written`: how many items the greedy answer holds before the end token (a histogram over the examples);
- `item_accuracy`: teacher-forced (prompt and the right answer in one forward), per item k, the fraction of
  examples whose argmax is right at every token of item k;
- `end_after_last`: teacher-forced, the fraction whose argmax right after the last item is the end token;
- `end_after_L` (n > L, L = the run's data.max_length): the mean probability of the end token right after item L,
  where the right answer goes on. Near 1, the run ends its answers at the longest length it trained on.

Exact match (eval-algorithmic's measure) needs all three: the right count, the right items and the end.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posenc_cli.api.models import load_model
from posenc_cli.cli.algorithmic import parse_lengths
from posenc_cli.data.tokenizer import Tokenizer
from posenc_cli.errors import UserError
from posenc_cli.evaluation.algorithmic import cell_examples, encode_example, until_end
from posenc_cli.evaluation.passkey import greedy_decode

ITEM_TASKS = ("copy", "reverse")  # answers of space-separated items, one per instance symbol
EXTRA_STEPS = 4  # greedy tokens past the answer's length: room to show an answer that runs on


def item_spans(tokenizer: Tokenizer, answer: str) -> list[tuple[int, int]]:
    """[start, end) token offsets of each item of `answer` (" a 7 Q") within its ids, with its leading space.
    Raises ValueError when the tokenizer does not cut the answer between items (the spans would not exist)."""
    items = answer.split()
    ids = tokenizer.encode(answer)
    spans, start = [], 0
    for k in range(len(items)):
        end = len(tokenizer.encode(" " + " ".join(items[: k + 1])))
        spans.append((start, end))
        start = end
    if start != len(ids):
        raise ValueError(f"the tokenizer does not cut {answer!r} between its items")
    return spans


def count_items(ids: np.ndarray, tokenizer: Tokenizer) -> int:
    """Items in a greedy answer: its text before the end token, split at spaces."""
    return len(tokenizer.decode(until_end(ids, tokenizer.eod_id)).split())


def teacher_forced(
    model: torch.nn.Module, tokenizer: Tokenizer, prompt: np.ndarray, answer: np.ndarray, answer_text: str, cap: int
) -> tuple[list[bool], bool, float | None]:
    """One example fed whole: (each item right at all its tokens, the end token argmax after the last item,
    P(end) right after item `cap` when the answer has more items, else None)."""
    full = torch.as_tensor(np.concatenate([prompt, answer]))[None]  # (1, P + A)
    with torch.no_grad():
        logits = model(full)[0].float()  # (P + A, V)
    first = len(prompt) - 1  # the logits at position first + j predict answer token j
    pred = logits.argmax(-1).numpy()
    spans = item_spans(tokenizer, answer_text)
    right = [bool(np.all(pred[first + a : first + b] == answer[a:b])) for a, b in spans]
    ends = bool(pred[first + len(answer) - 1] == tokenizer.eod_id)  # answer[-1] is the end token
    p_end = None
    if len(spans) > cap:
        p_end = float(torch.softmax(logits[first + spans[cap - 1][1]], -1)[tokenizer.eod_id])
    return right, ends, p_end


def diagnose_cell(
    model: torch.nn.Module, tokenizer: Tokenizer, task: str, length: int, examples: int, seed: int, cap: int
) -> dict[str, Any]:
    """The four measures of one (task, length) cell over `examples` prompts (module docstring)."""
    written: Counter[int] = Counter()
    items = np.zeros(length)
    ends, p_ends = 0, []
    for example in cell_examples(task, length, examples, seed):
        prompt, answer = encode_example(tokenizer, example)
        prompts = torch.as_tensor(prompt)[None]  # (1, P)
        with torch.no_grad():
            generated = greedy_decode(model, prompts, len(answer) + EXTRA_STEPS, stop_id=tokenizer.eod_id)
        written[count_items(generated[0].numpy(), tokenizer)] += 1
        right, end, p_end = teacher_forced(model, tokenizer, prompt, answer, example.answer, cap)
        items += right
        ends += end
        if p_end is not None:
            p_ends.append(p_end)
    return {
        "task": task,
        "length": length,
        "examples": examples,
        "written": dict(sorted(written.items())),
        "item_accuracy": [round(float(x) / examples, 4) for x in items],
        "end_after_last": ends / examples,
        "end_after_L": float(np.mean(p_ends)) if p_ends else None,
    }


def row(cell: dict[str, Any]) -> str:
    """One markdown row of a cell."""
    written = ", ".join(f"{n}: {count}" for n, count in cell["written"].items())
    items = " ".join(f"{100 * x:.0f}" for x in cell["item_accuracy"])
    end_l = "–" if cell["end_after_L"] is None else f"{cell['end_after_L']:.2f}"
    return f"| {cell['task']} | {cell['length']} | {written} | {items} | {100 * cell['end_after_last']:.0f} | {end_l} |"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of copy / reverse models")
    parser.add_argument("--lengths", default="6-12", help="instance lengths, e.g. 6-12 or 8,9,10")
    parser.add_argument("--examples", type=int, default=100, help="prompts per task and length")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts (eval-algorithmic's)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads")
    parser.add_argument("--json", type=Path, help="also write every cell here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        lengths = parse_lengths(args.lengths)
        if args.examples < 1:
            raise ValueError(f"--examples must be at least 1, got {args.examples}")
        torch.set_num_threads(args.threads)
        results: dict[str, list[dict[str, Any]]] = {}
        for run_dir in args.runs:
            run = load_model(run_dir)
            tasks = [t for t in run.config.data.tasks if t in ITEM_TASKS]
            if not tasks:
                raise ValueError(f"{run_dir} trained on none of {', '.join(ITEM_TASKS)}")
            cap = int(run.config.data.max_length)
            cells = [
                diagnose_cell(run.model, run.tokenizer, t, n, args.examples, args.seed, cap)
                for t in tasks
                for n in lengths
            ]
            results[str(run_dir)] = cells
            print(f"\n{run_dir} (L = {cap}; {args.examples} prompts a cell, seed {args.seed})\n")
            print("| task | n | items written: examples | each item right, teacher-forced (%) | end after the last (%) "
                  "| P(end) after item L |")  # fmt: skip
            print("|---|---|---|---|---|---|")
            for cell in cells:
                print(row(cell), flush=True)
    except (UserError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
