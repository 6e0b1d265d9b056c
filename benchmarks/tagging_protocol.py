"""S5 and A5 word problems under the reference's tagging protocol: the running product at every position (issue #44).

    nice -n 5 python benchmarks/tagging_protocol.py --out tagging_protocol.json     # S5, rope,path,nope, 1,500 steps

posenc's `s5`/`a5` tasks (`posenc_cli/data/algorithmic/state_tracking.py`) score one label per sequence, the final
product p_k as text, since a next-token decoder that read p_{t-1} would solve p_t by a lookup. The reference
(jopetty/word-problem 8f910f9, `src/main.py` with `tagging=True`, :553-568; Merrill, Petty, Sabharwal, ICML 2024,
arXiv 2404.08819) instead keeps inputs and targets apart: a causal model reads [BOS] x_1..x_k, one token per group
element, and is trained to output the running product p_t = p_{t-1}·x_t at every position t, k labels per
sequence; it reports token accuracy (share of positions right) and sequence accuracy (all k right) (:642-649).

This script trains posenc's model under that protocol. Tokens: element index 0..|G|-1 (S5: 120, A5: 60, in
`elements` order, identity first), and BOS = |G| at position 0 (the reference prepends [BOS], :197-202); the BOS
position carries no target. Attention is causal (posenc's ordinary forward), so position t sees x_1..x_t only. The
loss is the mean cross-entropy over the k tagged positions. Each step draws one k uniform on 2..K (the reference
trains every length 2..k) and a batch of that k; evaluation reads the argmax at every position of one forward, per
length k in 2..K and beyond in K+1..2K (the reference never tests k > K; that split is posenc's own).

Model and optimizer are the synthetic sweep's (configs/sweep/synthetic.yaml: `model=tiny`, d_model 64, 2 layers,
2 heads, `train=quick`; posenc's AdamW, warm-up then cosine, clipping at 1.0), the same initial weights for every
scheme (one seed), precision from posenc's `precision=auto`, 1 thread. The loop follows
`benchmarks/encoder_protocol.py`'s `train_arm` (its decoder arm: causal, targets apart from the inputs), with the
tagged batch as it is instead of that script's layouts.
PaTH costs about 5x RoPE per step at this size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch
from targets_loop import (  # benchmarks/ (the script's own folder): BOS carries no tag
    IGNORE,
    parse_options,
    train_on_targets,
)
from torch import Tensor

from posenc_cli.config import Config
from posenc_cli.data.algorithmic.state_tracking import IDENTITY, compose, elements
from posenc_cli.errors import ConfigError, UserError
from posenc_cli.model import GPT, build_model
from posenc_cli.positional import registry
from posenc_cli.run.config_compose import compose_config
from posenc_cli.run.device import autocast, cpu_name, resolve_precision, set_threads

GROUPS = ("S5", "A5")


@dataclass(frozen=True)
class Options:
    group: str = "S5"
    pos: str = "rope,path,nope"
    max_length: int = 10  # K: train on k in 2..K, beyond on K+1..2K
    layers: int = 2
    steps: int = 1500
    batch: int = 32
    lr: float = 1e-3
    warmup: int = 100
    eval_examples: int = 100  # per length (the synthetic sweep's data.eval_examples)
    seed: int = 0
    threads: int = 1


def schemes(options: Options) -> list[str]:
    """The `--pos` names; one `ConfigError` line for an unknown one or a bad size."""
    names = [p.strip() for p in options.pos.split(",") if p.strip()]
    known = set(registry())
    unknown = [p for p in names if p not in known]
    if not names or unknown:
        raise ConfigError(f"--pos {options.pos}: unknown scheme(s) {', '.join(unknown) or '(none)'}")
    if options.group not in GROUPS:
        raise ConfigError(f"--group {options.group}: use one of {', '.join(GROUPS)}")
    if min(options.max_length - 1, options.layers, options.steps, options.batch, options.eval_examples) < 1:
        raise ConfigError("--max-length must be >= 2; --layers, --steps, --batch, --eval-examples positive")
    return names


@cache
def table(group: str) -> np.ndarray:
    """The group's multiplication table on element indices: table[a, b] = index of elements[a]·elements[b]."""
    elems = elements(group)
    index = {p: i for i, p in enumerate(elems)}
    return np.array([[index[compose(p, x)] for x in elems] for p in elems], dtype=np.int64)  # (|G|, |G|)


def running_products(group: str, xs: np.ndarray) -> np.ndarray:
    """(B, k) element indices -> (B, k) indices of p_t = x_1·…·x_t (from the identity)."""
    mul = table(group)
    state = np.full(xs.shape[0], elements(group).index(IDENTITY))
    out = np.empty_like(xs)
    for t in range(xs.shape[1]):
        state = mul[state, xs[:, t]]
        out[:, t] = state
    return out


def sample_batch(group: str, rng: np.random.Generator, k: int, batch: int) -> tuple[Tensor, Tensor]:
    """x = [BOS ; x_1..x_k], y = [IGNORE ; p_1..p_k]: (B, k + 1) each, the k elements uniform on the group."""
    size = len(elements(group))
    xs = rng.integers(0, size, size=(batch, k))  # (B, k)
    ys = running_products(group, xs)  # (B, k)
    x = np.concatenate([np.full((batch, 1), size), xs], axis=1)  # (B, k + 1), BOS = |G|
    y = np.concatenate([np.full((batch, 1), IGNORE), ys], axis=1)  # (B, k + 1)
    return torch.from_numpy(x), torch.from_numpy(y)


def model_config(options: Options, pos: str) -> Config:
    """The sweep's tiny model and `train=quick`, with training length 2K + 1 (BOS and the longest beyond k)."""
    return compose_config(
        [
            "model=tiny",
            "model.d_model=64",
            f"model.n_layer={options.layers}",
            "model.n_head=2",
            f"pos={pos}",
            "train=quick",
            f"train.steps={options.steps}",
            f"train.warmup_steps={min(options.warmup, options.steps)}",
            f"train.batch_size={options.batch}",
            f"train.lr={options.lr}",
            f"train.seq_len={2 * options.max_length + 1}",
            f"train.seed={options.seed}",
        ]
    )


def training_batches(options: Options) -> list[tuple[Tensor, Tensor]]:
    """One batch per step, its k uniform on 2..K; the same batches for every scheme."""
    rng = np.random.default_rng(options.seed)
    return [
        sample_batch(options.group, rng, int(rng.integers(2, options.max_length + 1)), options.batch)
        for _ in range(options.steps)
    ]


def evaluation_sets(options: Options) -> dict[int, tuple[Tensor, Tensor]]:
    """Fresh examples at every k in 2..2K (a seed of their own)."""
    rng = np.random.default_rng(options.seed + 10_000)
    return {k: sample_batch(options.group, rng, k, options.eval_examples) for k in range(2, 2 * options.max_length + 1)}


@torch.no_grad()
def score(model: GPT, x: Tensor, y: Tensor, precision: str) -> dict[str, float]:
    """Token accuracy and sequence accuracy of the argmax at every tagged position of one causal forward."""
    model.eval()
    with autocast(torch.device("cpu"), precision):  # type: ignore[arg-type]
        predicted = model(x)[:, 1:].argmax(-1)  # (B, k): BOS's position is not scored
    right = predicted == y[:, 1:]  # (B, k)
    return {"token_accuracy": right.float().mean().item(), "sequence_accuracy": right.all(dim=1).float().mean().item()}


def run(options: Options) -> dict[str, object]:
    """Train and score every scheme from the same seed on the same batches; plain data per scheme and length."""
    names = schemes(options)
    threads = set_threads(options.threads)
    vocab = len(elements(options.group)) + 1  # the elements and BOS
    batches = training_batches(options)
    sets = evaluation_sets(options)
    precision = resolve_precision(model_config(options, names[0]).train.precision, torch.device("cpu"))
    results: dict[str, dict[str, object]] = {}
    for pos in names:
        cfg = model_config(options, pos)
        torch.manual_seed(options.seed)
        model = build_model(cfg, vocab)
        wall, cpu = time.perf_counter(), time.process_time()
        losses = train_on_targets(model, batches, cfg, precision)
        train_wall, train_cpu = time.perf_counter() - wall, time.process_time() - cpu
        per_length = {str(k): score(model, x, y, precision) for k, (x, y) in sets.items()}
        results[pos] = {
            "per_length": per_length,
            "parameters": model.num_parameters(),
            "loss_curve": [round(float(np.mean(losses[i : i + 100])), 4) for i in range(0, len(losses), 100)],
            "loss_last_50": float(np.mean(losses[-50:])),
            "train_wall_s": round(train_wall, 1),
            "train_cpu_s": round(train_cpu, 1),
        }
    return {
        "group": options.group,
        "options": asdict(options),
        "precision": precision,
        "threads": threads,
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "chance": 1 / (vocab - 1),
        "in_distribution": [2, options.max_length],
        "beyond": [options.max_length + 1, 2 * options.max_length],
        "schemes": results,
    }


def mean_over(per_length: dict[str, dict[str, float]], low: int, high: int, key: str) -> float:
    """The mean of `key` over lengths low..high (each length weighs the same)."""
    return float(np.mean([s[key] for k, s in per_length.items() if low <= int(k) <= high]))


def markdown(result: dict[str, object]) -> str:
    """One row per scheme: token and sequence accuracy in 2..K and K+1..2K, the final loss and CPU time."""
    low, K = result["in_distribution"]  # type: ignore[misc]
    _, high = result["beyond"]  # type: ignore[misc]
    lines = [
        f"| scheme | token acc {low}–{K} | sequence acc {low}–{K} | token acc {K + 1}–{high} | "
        f"sequence acc {K + 1}–{high} | loss (last 50) | train CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    schemes_ = result["schemes"]
    assert isinstance(schemes_, dict)
    for pos, r in schemes_.items():
        cells = [
            mean_over(r["per_length"], a, b, key)
            for a, b in ((low, K), (K + 1, high))
            for key in ("token_accuracy", "sequence_accuracy")
        ]
        lines.append(
            f"| {pos} | " + " | ".join(f"{c:.3f}" for c in cells) + f" | {r['loss_last_50']:.3f} | {r['train_cpu_s']} |"
        )
    return "\n".join(lines)


def parse(argv: Sequence[str] | None = None) -> tuple[Options, Path | None]:
    """The options and the JSON path (`--out`, None: print only)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--group", default=Options.group, help="S5 or A5")
    p.add_argument("--pos", default=Options.pos, help="comma-separated causal schemes")
    p.add_argument("--max-length", type=int, default=Options.max_length, help="K: train on 2..K, beyond K+1..2K")
    p.add_argument("--layers", type=int, default=Options.layers)
    return parse_options(p, Options, argv)


def main(argv: Sequence[str] | None = None) -> int:
    options, out = parse(argv)
    try:
        result = run(options)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"{result['group']} tagging, {options.steps} steps x {options.batch}, lr {options.lr}, {options.layers} "
        f"layers, {result['precision']} on {result['cpu']} ({result['threads']} thread(s)), chance "
        f"{result['chance']:.4f}"
    )
    print(markdown(result))
    schemes_ = result["schemes"]
    assert isinstance(schemes_, dict)
    for pos, r in schemes_.items():  # the training loss, mean of each 100 steps
        print(f"{pos} loss per 100 steps: {' '.join(f'{v:.3f}' for v in r['loss_curve'])}")
    if out is not None:
        out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
