"""Exact-match accuracy of greedy answers per algorithmic task × instance length (Kazemnejad et al. 2023;
`posenc eval-algorithmic`; the tasks are `posenc_cli.data.algorithmic`).

For each task and instance length n (default 1..2L, L the run's `data.max_length`), `examples` seeded examples become
prompts `<eod> prompt` (every training document follows an end-of-document token) and the model's greedy
continuation is decoded through the KV cache (`passkey.decode_ragged`). An example is right when the continuation
is exactly the answer's tokens followed by the end-of-document token, i.e. the answer and then a stop, as the
reference compares the whole generated output with the target (McGill-NLP/length-generalization 40f8a44,
`src/data/data_instance_processor/data_instance_processor.py` `is_prediction_correct`). The prompts of one cell
differ in length; they decode together, left-padded as training pads (`passkey.decode_ragged`: a pad is a document
of its own, so every row sees exactly its own tokens at positions 0..), each read as it was when prompts of one
length decoded at a time (`decode_plan`: its generation budget, cell length and position draws).

Cells go to `eval/algorithmic.json` through the shared loop (the task `evaluation.tasks.algorithmic`), keyed by
task, length, examples, seed, generator version, precision, the least training length and checkpoint; each records
L, the least training length (`train_min_length`: `data.min_length`, else the task's builder default `train_min`;
`data.algorithmic.in_distribution_lengths`) and whether n is in distribution (train_min..L, the lengths of training)
or not (beyond: L+1..2L, the paper's test split; lengths below train_min are measured but in neither mean). The
means weigh each length as the reference's splits do (`AlgorithmicTask.length_weight`, a property of the task: the
number of equally filled builder bins of that length, 1 for every task but addition, whose 2(n − train_min) + 1
operand-length pairs each hold as many examples; `make_addition_dataset.py:86-133`). A cell whose longest example
needs more positions than the scheme can read is n/a with the reason every evaluation gives.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from posenc_cli.data.algorithmic import in_distribution_lengths, paper_tasks, task_class
from posenc_cli.data.algorithmic import registry as task_registry
from posenc_cli.data.algorithmic.base import GENERATOR_VERSION, MAX_LENGTH, Example
from posenc_cli.data.sources.algorithmic import PAPER_MAX_LENGTH, AlgorithmicDataConfig
from posenc_cli.errors import ConfigError
from posenc_cli.evaluation.passkey import check_readable, decode_ragged
from posenc_cli.evaluation.positions import BeyondRange, Positions
from posenc_cli.evaluation.results import read_results_file
from posenc_cli.evaluation.teacher_forced import evaluate_scored_cell

if TYPE_CHECKING:
    from torch import nn

    from posenc_cli.data.tokenizer import Tokenizer

ALGORITHMIC_FILE = Path("eval") / "algorithmic.json"
COMMAND = "eval-algorithmic"
SAMPLES_PER_CELL = 3
MEASURES = 2  # version of what a cell records: 1 exact match only, 2 also token_accuracy
DEFAULT_EXAMPLES = 100
Progress = Callable[[str, int, int], None]  # (description, done, total)


@dataclass(kw_only=True)
class AlgorithmicEvalConfig:
    """Options of `posenc eval-algorithmic` (flags mirror these fields). None means: the run's `data=algorithmic`
    settings (tasks, L = data.max_length, lengths 1..data.eval_max_length or 2L, data.eval_examples), and for a run
    trained on other data every task, L = 20 (the paper's), 1..2L and 100 examples."""

    tasks: list[str] | None = None
    lengths: list[int] | None = None
    max_length: int | None = None
    examples: int | None = None
    seed: int = 0
    batch_tokens: int = 16384
    dtype: str = "auto"
    force: bool = False

    def validate(self) -> None:
        if self.tasks is not None:
            if not self.tasks:
                raise ConfigError("--tasks needs at least one task")
            for name in self.tasks:
                task_class(name)
        if self.lengths is not None:
            if not self.lengths:
                raise ConfigError("--lengths needs at least one length")
            if any(not 1 <= n <= 2 * MAX_LENGTH for n in self.lengths):
                raise ConfigError(f"--lengths must be instance lengths in [1, {2 * MAX_LENGTH}], got {self.lengths}")
        if self.max_length is not None and not 1 <= self.max_length <= MAX_LENGTH:
            raise ConfigError(f"--max-length must be in [1, {MAX_LENGTH}], got {self.max_length}")
        if self.examples is not None and self.examples < 1:
            raise ConfigError(f"--examples must be >= 1, got {self.examples}")
        if self.batch_tokens < 1:
            raise ConfigError(f"--batch-tokens must be >= 1, got {self.batch_tokens}")
        if self.seed < 0:
            raise ConfigError(f"--seed must be >= 0, got {self.seed}")
        if self.dtype not in ("auto", "fp32", "bf16"):
            raise ConfigError(f"--dtype must be auto, fp32 or bf16, got {self.dtype!r}")


@dataclass(frozen=True)
class Plan:
    """What one run is asked: tasks, instance lengths, L (training's longest length), examples per cell and each
    task's least training length (its in-distribution lengths are least[task]..L)."""

    tasks: list[str]
    lengths: list[int]
    max_length: int
    examples: int
    least: dict[str, int]


def plan_for(cfg: AlgorithmicEvalConfig, data: Any) -> Plan:
    """`cfg` with its None fields filled from the run's data config `data` (see `AlgorithmicEvalConfig`)."""
    trained = data if isinstance(data, AlgorithmicDataConfig) else None
    tasks = cfg.tasks or (list(trained.tasks) if trained else paper_tasks())
    max_length = cfg.max_length or (trained.max_length if trained else PAPER_MAX_LENGTH)
    top = trained.test_max_length if trained and cfg.max_length is None else 2 * max_length
    lengths = sorted(set(cfg.lengths)) if cfg.lengths else list(range(1, top + 1))
    examples = cfg.examples or (trained.eval_examples if trained else DEFAULT_EXAMPLES)
    min_length = trained.min_length if trained else None
    least = {t: in_distribution_lengths(t, max_length, min_length)[0] for t in tasks}
    return Plan(tasks, lengths, max_length, examples, least)


def cell_examples(task: str, length: int, n: int, seed: int, least: int | None = None) -> list[Example]:
    """The `n` examples of one cell, drawn as a split whose lengths start at `least` (None: the task's `train_min`)
    draws them: they depend only on (seed, generator version, task, length, least), not on the other cells asked,
    and never on a training stream (those are seeded with three numbers, these with five)."""
    cls = task_class(task)
    rng = np.random.default_rng([seed, GENERATOR_VERSION, 2, zlib.crc32(task.encode()), length])
    return [cls.sample_in(rng, length, cls.train_min if least is None else least) for _ in range(n)]


def encode_example(tokenizer: Tokenizer, example: Example) -> tuple[np.ndarray, np.ndarray]:
    """(prompt ids with the leading end-of-document token, answer ids with the closing one). Raises ValueError when
    the tokenizer cuts `prompt + answer` elsewhere than between the two (then the prompt is not what training saw)."""
    prompt = np.asarray(tokenizer.encode(example.prompt), dtype=np.int64)
    answer = np.asarray(tokenizer.encode(example.answer), dtype=np.int64)
    whole = np.asarray(tokenizer.encode(example.text), dtype=np.int64)
    if not np.array_equal(whole, np.concatenate([prompt, answer])):
        raise ValueError(f"the tokenizer does not cut {example.text!r} between prompt and answer")
    eod = np.array([tokenizer.eod_id], dtype=np.int64)
    return np.concatenate([eod, prompt]), np.concatenate([answer, eod])


def until_end(ids: np.ndarray, eod_id: int) -> np.ndarray:
    """Generated ids before the first end-of-document token."""
    stop = np.flatnonzero(ids == eod_id)
    return ids[: stop[0]] if len(stop) else ids


def evaluate_cell(
    model: nn.Module,
    tokenizer: Tokenizer,
    examples: Sequence[Example],
    *,
    batch_tokens: int = 16384,
    dtype: str = "fp32",
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    label: str = "",
    positions: Positions | None = None,
) -> dict[str, Any]:
    """Greedy answers to `examples`: {correct, accuracy (exact match), token_accuracy (the mean over examples of the
    fraction of answer positions, the closing end token included, whose greedy token is right: Ruoss et al. 2023's
    per-token accuracy), tokens (the longest prompt + answer, end tokens included), samples}. Raises
    `LengthBeyondScheme` (before any forward) when the model cannot read the longest example, and `BeyondRange` when
    randomized `positions` cannot draw that many ids (`decode_plan` draws them)."""
    if any(e.scored is not None for e in examples):  # MQAR, flip-flop: many positions, teacher-forced
        options: dict[str, Any] = {"batch_tokens": batch_tokens, "dtype": dtype, "device": device, "label": label}
        return evaluate_scored_cell(model, tokenizer, examples, progress=progress, positions=positions, **options)
    encoded = [encode_example(tokenizer, e) for e in examples]
    tokens = max(len(p) + len(a) for p, a in encoded)
    check_readable(model, tokens)  # it reads every token but the last generated one
    if positions is not None and (beyond := positions.beyond_range(tokens)) is not None:
        raise BeyondRange(beyond)
    steps, ids = decode_plan([len(p) for p, _ in encoded], [len(a) for _, a in encoded], positions)
    cells = [len(p) + s for (p, _), s in zip(encoded, steps, strict=True)]
    prompts = [p for p, _ in encoded]
    outputs = decode_ragged(model, prompts, steps, cells, batch_tokens, dtype, device, progress, label, ids)
    right = np.zeros(len(examples), dtype=bool)
    matched = np.zeros(len(examples), dtype=np.float64)  # per example: the fraction of answer tokens right
    for i, ((_, answer), generated) in enumerate(zip(encoded, outputs, strict=True)):
        right[i] = np.array_equal(generated[: len(answer)], answer)
        matched[i] = float(np.mean(generated[: len(answer)] == answer))
    samples = [
        {
            "prompt": e.prompt,
            "answer": e.answer,
            "output": tokenizer.decode(until_end(outputs[i], tokenizer.eod_id)),
        }
        for i, e in enumerate(examples[:SAMPLES_PER_CELL])
    ]
    correct = int(right.sum())
    return {
        "correct": correct,
        "accuracy": correct / len(examples),
        "token_accuracy": float(matched.mean()),
        "tokens": int(tokens),
        "samples": samples,
    }


def decode_plan(
    widths: Sequence[int], answers: Sequence[int], positions: Positions | None
) -> tuple[list[int], list[torch.Tensor] | None]:
    """Per example of one cell (prompt width, answer tokens) -> (tokens to generate, position ids or None): every
    prompt of one width generates the most answer tokens among them, and is read as a cell of width + that many
    tokens; randomized `positions` draw each width's rows, in order, from the generator of that length
    (`Positions.generator`). What the decode of one width at a time gave, now that prompts of every width decode
    together (`passkey.decode_ragged`), so a cell's results are the same."""
    by_width: dict[int, list[int]] = {}
    for i, w in enumerate(widths):
        by_width.setdefault(w, []).append(i)
    steps = [0] * len(widths)
    ids: list[torch.Tensor] = [torch.empty(0)] * len(widths)
    random = positions is not None and positions.random
    for width, rows in sorted(by_width.items()):
        most = max(answers[i] for i in rows)
        drawn = None
        if random and positions is not None:
            drawn = positions.draw(len(rows), width + most, positions.generator(width + most))  # (n, ..., w + most)
        for r, i in enumerate(rows):
            steps[i] = most
            if drawn is not None:
                ids[i] = drawn[r]  # (width + most,) or (layers, width + most)
    return steps, ids if random else None


# ----------------------------------------------------------------------------------------------------------------
# Results file and runs.


def load_algorithmic_results(run_dir: Path | str) -> dict[str, Any] | None:
    """The stored `eval/algorithmic.json` of a run, None when absent; CheckpointError when unreadable."""
    return read_results_file(Path(run_dir) / ALGORITHMIC_FILE, COMMAND)


# ----------------------------------------------------------------------------------------------------------------
# Summaries (what the tables print; pure functions of the entries).


@dataclass(frozen=True)
class TaskSummary:
    """One task of one run: accuracy per measured length (None: n/a), and the mean accuracy over the measured
    lengths min_length..L (in distribution) and over L+1..2L (beyond; the paper's test split), each length weighed
    as the reference's split weighs it (`split_mean`), None when none was measured."""

    task: str
    max_length: int
    accuracy: dict[int, float | None]
    in_distribution: float | None
    beyond: float | None
    min_length: int = 1


def length_weight(task: str, length: int, least: int) -> int:
    """The weight of `length` in `task`'s split means (`AlgorithmicTask.length_weight`; 1 for an unknown task)."""
    cls = task_registry().get(task)
    return cls.length_weight(length, least) if cls is not None else 1


def split_mean(task: str, accuracy: dict[int, float | None], low: int, high: int, least: int) -> float | None:
    """The mean of the measured accuracies at lengths low..high, each weighed by its number of builder bins in a split
    whose lengths start at `least` (the share of the reference's split at that length); None when none was measured."""
    cells = [(length_weight(task, n, least), a) for n, a in accuracy.items() if low <= n <= high and a is not None]
    total = sum(w for w, _ in cells)
    return sum(w * a for w, a in cells) / total if total else None


def summarize(entries: Sequence[dict[str, Any]]) -> list[TaskSummary]:
    """Per task (in first-seen order): accuracy by length and the in-distribution / beyond-L means. Cells of one
    task must share L (a run has one); the latest entry per length wins."""
    by_task: dict[str, dict[int, dict[str, Any]]] = {}
    for e in entries:
        by_task.setdefault(str(e["task"]), {})[int(e["length"])] = e
    out = []
    for task, cells in by_task.items():
        limits = {int(e["train_max_length"]) for e in cells.values()}
        if len(limits) != 1:
            raise ValueError(f"cells of task {task} were measured with different L: {sorted(limits)}")
        (limit,) = limits
        accuracy = {
            n: (float(e["accuracy"]) if e.get("status") == "ok" and e.get("accuracy") is not None else None)
            for n, e in sorted(cells.items())
        }
        least = min(int(e.get("train_min_length", 1)) for e in cells.values())  # 1: stored before train_min
        inside = split_mean(task, accuracy, least, limit, least)
        beyond = split_mean(task, accuracy, limit + 1, 2 * limit, least)
        out.append(TaskSummary(task, limit, accuracy, inside, beyond, least))
    return out


def combined_json(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """All runs' results in one JSON-safe document (for --json)."""
    return {"schema_version": 1, "runs": [{k: v for k, v in r.items() if k != "reused"} for r in results]}
