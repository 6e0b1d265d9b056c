"""The Chomsky tasks' encoder protocol (the reference's) against posenc's decoder, on one task (issue #44 item 2).

    nice -n 5 python benchmarks/encoder_protocol.py --out encoder_protocol.json     # bucket_sort, RoPE, ~1,500 steps

Delétang et al. (ICLR 2023, arXiv 2207.02098) and Ruoss et al. (ACL 2023, arXiv 2305.16843) score these tasks with
an encoder (google-deepmind/randomized_positional_encodings `models/transformer.py:76`, no causal mask): it reads
the input followed by `output_length(n)` empty tokens and reads every output at its empty token in one forward
(`experiments/utils.py:32-92`). posenc trains a decoder. This script trains the SAME model config (`model=tiny` at
d_model 64, 2 layers, 2 heads, the chosen scheme) twice, from the same initial weights, with the same AdamW, warm-up
and cosine schedule, gradient clipping, batches of the same sampled examples, seed and precision, and changes only
the protocol:

- `decoder` (posenc's): causal, `[input ; separator ; outputs]`, the loss on the outputs only, evaluated by greedy
  generation of the outputs, each fed back (`evaluation.passkey.greedy_decode`, through the KV cache);
- `encoder` (the reference's): `causal=False`, `[input ; blanks]` with a blank token that is no task symbol, the
  targets at the blanks, evaluated by the argmax at the blanks of one forward.

Both arms see sequences of n + m tokens with the m targets at the same positions n..n+m−1; only the last m input
tokens (separator and outputs shifted by one, or blanks) and the mask differ. Tokens are the task's symbols, one
token per symbol (no task name, no spaces), so neither arm pays for posenc's text layout. Training draws one
length n per step, uniform on the task's 1..L, and a batch of that length, as the reference's training loop does
(`experiments/training.py`, `run`; `curriculum.py`, `UniformCurriculum`): no padding, which an encoder would see.
The loss is the mean cross-entropy over the targets (the reference's, over the tape positions). The optimizer is
posenc's in both arms (AdamW, betas 0.9/0.95, weight decay 0.1, warm-up then cosine, gradients clipped to global
norm 1.0), not the reference's constant-lr Adam (`training.py`): the comparison is of protocols, not optimizers.

Why a loop of its own: posenc's trainer (`posenc_cli.run.train`) has no encoder protocol; training it is one
forward, a masked cross-entropy and an AdamW step, built from posenc's own pieces (`compose_config`, `build_model`,
`resolve_precision`, the task's generator `AlgorithmicTask.sample`); the loop is `targets_loop.py`, shared with
`tagging_protocol.py`.

The default task is `bucket_sort` (symbols 0–4 sorted; output length n): its outputs depend on each other (the
k-th output is the k-th smallest input), so the decoder, which sees the outputs before, and the encoder, which
must place each output by its blank's rank alone, can differ; a one-output task (`even_pairs`) gives both arms the
same one target after the whole input, so only the mask differs. `duplicate_string` (2n outputs) is the harder
copy; use `--task` for it or for the one-output tasks. Tasks whose output length depends on the sample
(`stack_manipulation`, `binary_addition`: termination then padding) are refused.

Which schemes run non-causally: `NONCAUSAL` lists those whose hooks are defined for keys after the query (RoPE's
rotation, learned and sinusoidal tables, NoPE, and the |i − j| biases of Kerple and Sandwich); the others are refused
in one line (ALiBi's key-bias road and T5's buckets clamp i − j at 0, xPos grows with future keys, PaTH gives NaN,
CoPE, FoX and stick-breaking count gates causally, FIRE normalises by the query's own position). NoPE without the
causal mask sees a bag of tokens: its encoder can tell neither the order of the input nor one blank from another.
Learned positions have a table of the training length (L + m(L) tokens): beyond it neither arm can run, and those
rows read `null`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from targets_loop import IGNORE, parse_options, train_on_targets  # benchmarks/ (the script's own folder)
from torch import Tensor

from posenc_cli.config import Config
from posenc_cli.data.algorithmic import task_class
from posenc_cli.data.algorithmic.base import AlgorithmicTask
from posenc_cli.errors import ConfigError, UserError
from posenc_cli.evaluation.passkey import greedy_decode
from posenc_cli.model import GPT, build_model
from posenc_cli.run.config_compose import compose_config
from posenc_cli.run.device import autocast, cpu_name, resolve_precision, set_threads

Protocol = Literal["decoder", "encoder"]
PROTOCOLS: tuple[Protocol, ...] = ("decoder", "encoder")
# the Chomsky tasks whose output length is a function of n alone (stack_manipulation and binary_addition end with a
# termination token after a sample-dependent number of outputs)
OUTPUT_LENGTH = {
    "bucket_sort": lambda n: n,
    "duplicate_string": lambda n: 2 * n,
    "even_pairs": lambda n: 1,
    "cycle_navigation": lambda n: 1,
    "modular_arithmetic": lambda n: 1,
    "missing_duplicate": lambda n: 1,
}
NONCAUSAL = ("rope", "learned", "sinusoidal", "nope", "kerple", "sandwich")
SYMBOLS = "0123456789+-*"  # every symbol of the supported tasks' inputs and outputs: token id = index
SEP = len(SYMBOLS)  # the decoder's separator (posenc's ` =`)
BLANK = SEP + 1  # the encoder's empty tape token (the reference's extra one-hot dimension)
VOCAB = BLANK + 1


@dataclass(frozen=True)
class Options:
    task: str = "bucket_sort"
    pos: str = "rope"
    max_length: int = 40  # L: training on 1..L (the reference's 1..40), beyond on L+1..2L
    steps: int = 1500
    batch: int = 32
    lr: float = 1e-3
    warmup: int = 100
    eval_examples: int = 100  # per length and arm (the synthetic sweep's data.eval_examples)
    seed: int = 0
    threads: int = 1
    bin: int = 10  # lengths per row of the markdown table


def check(options: Options) -> type[AlgorithmicTask]:
    """The task's class; one `ConfigError` line for a task or scheme the protocols cannot both run."""
    if options.task not in OUTPUT_LENGTH:
        raise ConfigError(
            f"--task {options.task}: its output length depends on the sample; use one of {', '.join(OUTPUT_LENGTH)}"
        )
    if options.pos not in NONCAUSAL:
        raise ConfigError(
            f"--pos {options.pos} is causal only (its positions are undefined for later keys); "
            f"the encoder arm runs {', '.join(NONCAUSAL)}"
        )
    if options.max_length < 1 or options.steps < 1 or options.batch < 1 or options.eval_examples < 1:
        raise ConfigError("--max-length, --steps, --batch and --eval-examples must be positive")
    return task_class(options.task)


def model_config(options: Options) -> Config:
    """The sweep's tiny model (configs/sweep/synthetic.yaml: d_model 64, 2 layers, 2 heads, `train=quick`), its
    scheme, and a training length of the longest training sequence, L + m(L) tokens."""
    longest = options.max_length + OUTPUT_LENGTH[options.task](options.max_length)
    return compose_config(
        [
            "model=tiny",
            "model.d_model=64",
            "model.n_layer=2",
            "model.n_head=2",
            f"pos={options.pos}",
            "train=quick",
            f"train.steps={options.steps}",
            f"train.warmup_steps={min(options.warmup, options.steps)}",
            f"train.batch_size={options.batch}",
            f"train.lr={options.lr}",
            f"train.seq_len={longest}",
            f"train.seed={options.seed}",
        ]
    )


def tokens(text: str) -> list[int]:
    """Space-separated symbols -> token ids: ' 0 1 4' -> [0, 1, 4]."""
    return [SYMBOLS.index(s) for s in text.split()]


def sample_batch(task: type[AlgorithmicTask], rng: np.random.Generator, n: int, batch: int) -> tuple[Tensor, Tensor]:
    """`batch` examples of length n from the task's generator -> inputs (B, n_in), outputs (B, m) token ids."""
    examples = [task.sample(rng, n) for _ in range(batch)]
    inputs = [tokens(e.prompt.split(":", 1)[1].removesuffix(" =")) for e in examples]
    outputs = [tokens(e.answer) for e in examples]
    return torch.tensor(inputs), torch.tensor(outputs)


def decoder_batch(inputs: Tensor, outputs: Tensor) -> tuple[Tensor, Tensor]:
    """posenc's layout: x = [input ; SEP ; outputs[:-1]], y = the outputs at SEP and after it: (B, n + m) each."""
    sep = torch.full((inputs.shape[0], 1), SEP, dtype=torch.long)
    x = torch.cat([inputs, sep, outputs[:, :-1]], dim=1)  # (B, n + m)
    y = torch.cat([torch.full_like(inputs, IGNORE), outputs], dim=1)  # (B, n + m)
    return x, y


def encoder_batch(inputs: Tensor, outputs: Tensor) -> tuple[Tensor, Tensor]:
    """The reference's layout: x = [input ; m blanks], y = the outputs at the blanks: (B, n + m) each."""
    x = torch.cat([inputs, torch.full_like(outputs, BLANK)], dim=1)  # (B, n + m)
    y = torch.cat([torch.full_like(inputs, IGNORE), outputs], dim=1)  # (B, n + m)
    return x, y


LAYOUT = {"decoder": decoder_batch, "encoder": encoder_batch}


def logits_of(model: GPT, protocol: Protocol, x: Tensor) -> Tensor:
    """(B, T) -> (B, T, V): causal for the decoder, unmasked for the encoder."""
    return model(x, causal=protocol == "decoder")


def train_arm(
    model: GPT, protocol: Protocol, batches: Sequence[tuple[Tensor, Tensor]], cfg: Config, precision: str
) -> list[float]:
    """`targets_loop.train_on_targets` on the arm's layout of each (inputs, outputs) batch; the loss per step."""
    laid_out = (LAYOUT[protocol](inputs, outputs) for inputs, outputs in batches)
    return train_on_targets(model, laid_out, cfg, precision, lambda m, x: logits_of(m, protocol, x))


@torch.no_grad()
def predict(model: GPT, protocol: Protocol, inputs: Tensor, m: int, precision: str) -> Tensor:
    """The arm's m outputs (B, m): greedy generation after [input ; SEP], or the argmax at the m blanks."""
    model.eval()
    if protocol == "decoder":
        prompt = torch.cat([inputs, torch.full((inputs.shape[0], 1), SEP, dtype=torch.long)], dim=1)  # (B, n + 1)
        return greedy_decode(model, prompt, m, use_bf16=precision == "bf16")
    x, _ = encoder_batch(inputs, torch.zeros(inputs.shape[0], m, dtype=torch.long))
    with autocast(torch.device("cpu"), precision):  # type: ignore[arg-type]
        return logits_of(model, protocol, x)[:, -m:].argmax(-1)  # (B, m)


def score(predicted: Tensor, outputs: Tensor) -> dict[str, float]:
    """Per-position accuracy (the reference's) and exact match of whole outputs (posenc's `accuracy`)."""
    right = predicted == outputs  # (B, m)
    return {"token_accuracy": right.float().mean().item(), "exact_match": right.all(dim=1).float().mean().item()}


def evaluate_arm(
    model: GPT, protocol: Protocol, sets: dict[int, tuple[Tensor, Tensor]], precision: str
) -> dict[int, dict[str, float] | None]:
    """Scores per length; None where the length is past the scheme's position limit (learned tables)."""
    limit = model.scheme.max_length
    out: dict[int, dict[str, float] | None] = {}
    for n, (inputs, outputs) in sets.items():
        if limit is not None and inputs.shape[1] + outputs.shape[1] > limit:
            out[n] = None
            continue
        out[n] = score(predict(model, protocol, inputs, outputs.shape[1], precision), outputs)
        if protocol == "decoder":  # the true outputs fed back: how much of its error is its own outputs' fault
            out[n]["teacher_forced_token_accuracy"] = teacher_forced(model, inputs, outputs, precision)
    return out


@torch.no_grad()
def teacher_forced(model: GPT, inputs: Tensor, outputs: Tensor, precision: str) -> float:
    """The decoder's per-position accuracy with the true outputs fed (one causal forward of its training layout)."""
    x, _ = decoder_batch(inputs, outputs)
    with autocast(torch.device("cpu"), precision):  # type: ignore[arg-type]
        predicted = logits_of(model, "decoder", x)[:, -outputs.shape[1] :].argmax(-1)  # (B, m)
    return (predicted == outputs).float().mean().item()


def training_batches(task: type[AlgorithmicTask], options: Options) -> list[tuple[Tensor, Tensor]]:
    """One (inputs, outputs) batch per step, its length uniform on train_min..L (the reference's training draw)."""
    rng = np.random.default_rng(options.seed)
    low = max(task.train_min, task.min_length)
    return [
        sample_batch(task, rng, int(rng.integers(low, options.max_length + 1)), options.batch)
        for _ in range(options.steps)
    ]


def evaluation_sets(task: type[AlgorithmicTask], options: Options) -> dict[int, tuple[Tensor, Tensor]]:
    """Fresh examples at every length 1..2L (a seed of their own), the same for both arms."""
    rng = np.random.default_rng(options.seed + 10_000)
    low = max(task.train_min, task.min_length)
    return {n: sample_batch(task, rng, n, options.eval_examples) for n in range(low, 2 * options.max_length + 1)}


def run(options: Options) -> dict[str, object]:
    """Train and score both arms; the result as plain data (per length, per arm), with times and the setting."""
    task = check(options)
    threads = set_threads(options.threads)
    cfg = model_config(options)
    device = torch.device("cpu")
    precision = resolve_precision(cfg.train.precision, device)
    batches = training_batches(task, options)
    sets = evaluation_sets(task, options)
    arms: dict[str, dict[str, object]] = {}
    parameters = 0
    for protocol in PROTOCOLS:
        torch.manual_seed(options.seed)  # the same initial weights in both arms
        model = build_model(cfg, VOCAB)
        parameters = model.num_parameters()
        wall, cpu = time.perf_counter(), time.process_time()
        losses = train_arm(model, protocol, batches, cfg, precision)
        train_wall, train_cpu = time.perf_counter() - wall, time.process_time() - cpu
        scores = evaluate_arm(model, protocol, sets, precision)
        arms[protocol] = {
            "per_length": {str(n): s for n, s in scores.items()},
            "loss_last_50": float(np.mean(losses[-50:])),  # the training loss over the last 50 steps
            "train_wall_s": round(train_wall, 1),
            "train_cpu_s": round(train_cpu, 1),
            "total_wall_s": round(time.perf_counter() - wall, 1),
            "total_cpu_s": round(time.process_time() - cpu, 1),
        }
    return {
        "task": options.task,
        "pos": options.pos,
        "options": asdict(options),
        "precision": precision,
        "threads": threads,
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "parameters": parameters,
        "in_distribution": [max(task.train_min, task.min_length), options.max_length],
        "beyond": [options.max_length + 1, 2 * options.max_length],
        "arms": arms,
    }


COLUMNS = (  # (arm, measure, header) of the markdown table
    ("decoder", "token_accuracy", "decoder per-position"),
    ("decoder", "teacher_forced_token_accuracy", "decoder per-position, teacher-forced"),
    ("decoder", "exact_match", "decoder exact"),
    ("encoder", "token_accuracy", "encoder per-position"),
    ("encoder", "exact_match", "encoder exact"),
)


def mean_over(per_length: dict[str, dict[str, float] | None], low: int, high: int, key: str) -> float | None:
    """The mean of `key` over lengths low..high that ran (each length weighs the same); None if none ran."""
    values = [s[key] for n, s in per_length.items() if low <= int(n) <= high and s is not None and key in s]
    return float(np.mean(values)) if values else None


def rows(result: dict[str, object], bin_size: int) -> list[tuple[str, list[float | None]]]:
    """Table rows: bins of `bin_size` lengths, then the in-distribution and beyond means; each row's values are
    those of `COLUMNS`."""
    arms = result["arms"]
    assert isinstance(arms, dict)
    low, L = result["in_distribution"]  # type: ignore[misc]
    _, high = result["beyond"]  # type: ignore[misc]
    spans = [(a, min(a + bin_size - 1, L)) for a in range(low, L + 1, bin_size)]  # bins end at L, then restart
    spans += [(a, min(a + bin_size - 1, high)) for a in range(L + 1, high + 1, bin_size)]
    labelled = [(f"{a}–{b}" if a != b else str(a), a, b) for a, b in spans]
    labelled += [(f"**in {low}–{L}**", low, L), (f"**beyond {L + 1}–{high}**", L + 1, high)]
    return [
        (label, [mean_over(arms[arm]["per_length"], a, b, key) for arm, key, _ in COLUMNS]) for label, a, b in labelled
    ]


def markdown(result: dict[str, object], bin_size: int = 10) -> str:
    """The side-by-side table: per-position accuracy and exact match of each arm per length bin, in and beyond."""
    lines = ["| lengths n | " + " | ".join(h for *_, h in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for label, values in rows(result, bin_size):
        cells = ["n/a" if v is None else f"{v:.3f}" for v in values]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return "\n".join(lines)


def parse(argv: Sequence[str] | None = None) -> tuple[Options, Path | None]:
    """The options and the JSON path (`--out`, None: print only)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--task", default=Options.task, help="a Chomsky task of fixed output length")
    p.add_argument("--pos", default=Options.pos, help=f"the scheme, one of {', '.join(NONCAUSAL)}")
    p.add_argument("--max-length", type=int, default=Options.max_length, help="L: train on 1..L, beyond L+1..2L")
    p.add_argument("--bin", type=int, default=Options.bin, help="lengths per table row")
    return parse_options(p, Options, argv)


def main(argv: Sequence[str] | None = None) -> int:
    options, out = parse(argv)
    try:
        result = run(options)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    arms = result["arms"]
    assert isinstance(arms, dict)
    print(
        f"{result['task']}, pos={result['pos']}, {options.steps} steps x {options.batch}, lr {options.lr}, "
        f"{result['precision']} on {result['cpu']} ({result['threads']} thread(s)), {result['parameters']} parameters"
    )
    for p in PROTOCOLS:
        a = arms[p]
        print(
            f"{p}: loss {a['loss_last_50']:.4f} (last 50 steps), train {a['train_wall_s']} s wall / "
            f"{a['train_cpu_s']} s CPU, with evaluation {a['total_wall_s']} s wall / {a['total_cpu_s']} s CPU"
        )
    print(markdown(result, options.bin))
    if out is not None:
        out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
