"""Passkey retrieval (Mohtashami & Jaggi 2023, landmark attention; used by YaRN): a training task and an evaluation.

An episode is filler text repeated to a target length with one key sentence hidden at a depth, then a question:

    <filler[:b]> The pass key is 12345. Remember it. 12345 is the pass key.<filler[b:n]> What is the pass key?
    The pass key is 12345

Depth = b / n, the fraction of the filler before the key sentence (0: the key opens the episode, 1: it sits right
before the question). The prompt is everything before the answer's digits; the answer is " NNNNN" minus any
leading whitespace-only tokens (for bytes the space ends the prompt and the answer is exactly the digits). Every
piece starts with a space and ends without one, so byte-level BPE cuts the joined text at the same places as the
pieces one by one (its pre-tokenizer splits before " word" / " 123"), and token-level prompts match the text the
model trained on. The landmark/YaRN preamble sentence is left out: at a training length of 128 bytes it would not
fit.

- `data=passkey` (`corpus_documents`): a seeded list of episodes whose lengths (in characters, = byte tokens) are
  uniform in [data.passkey_min_len, data.passkey_max_len], depths uniform in [0, 1]; tokenized by the ordinary
  token cache, so `train()` runs unchanged. Short episodes (about the training length) teach retrieval; longer
  ones at evaluation test whether it survives beyond the training length.
- `posenc eval-passkey` (`evaluate_passkey_run`): for each length × depth, `trials` prompts of exactly that many
  tokens (prompt + answer) with fresh seeded keys, greedy decoding of the answer's tokens (batched; one forward
  per generated token), exact match. Results go to `eval/passkey.json` in the style of `eval/extrapolate.json`.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from posenc_cli import __version__
from posenc_cli.config import DataConfig, EvalConfig
from posenc_cli.errors import ConfigError, LengthBeyondScheme
from posenc_cli.evaluate import (
    evaluate_each_run,
    find_runs,
    new_results_doc,
    plan_lengths,
    read_results_file,
    resolve_dtype,
)
from posenc_cli.fsutil import atomic_write_json
from posenc_cli.report import LABEL_MAX_WIDTH, fit_to_content

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from rich.table import Table

    from posenc_cli.checkpoint import LoadedRun
    from posenc_cli.tokenizer import Tokenizer

FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY_SENTENCE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
GENERATOR_VERSION = 1  # bump when the episode text or the sampling changes (part of the corpus fingerprint)
SCHEMA_VERSION = 1
RESULTS_FILE = Path("eval") / "passkey.json"
SAMPLES_PER_CELL = 3
Progress = Callable[[str, int, int], None]  # (description, done, total)

__all__ = [
    "FILLER",
    "KEY_SENTENCE",
    "QUESTION",
    "RESULTS_FILE",
    "PasskeyConfig",
    "PromptBatch",
    "PromptTooShort",
    "build_prompts",
    "corpus_documents",
    "corpus_info",
    "episode_text",
    "evaluate_passkey_model",
    "evaluate_passkey_paths",
    "evaluate_passkey_run",
    "exact_match",
    "greedy_decode",
    "load_passkey_results",
    "make_episodes",
    "passkey_figure",
    "passkey_table",
    "random_keys",
    "token_share",
]


# ----------------------------------------------------------------------------------------------------------------
# Episode text (training corpus).


def random_keys(rng: np.random.Generator, n: int, digits: int) -> list[str]:
    """`n` uniform keys of exactly `digits` digits (no leading zero)."""
    low = 10 ** (digits - 1) if digits > 1 else 0
    return [str(k) for k in rng.integers(low, 10**digits, size=n)]


def filler_before(n_filler: int, depth: float) -> int:
    """Filler units placed before the key sentence: round(depth · n_filler)."""
    return round(depth * n_filler)


def episode_text(key: str, n_filler: int, depth: float) -> tuple[str, str]:
    """(prompt, answer) with `n_filler` characters of filler, the key sentence after `depth` of them."""
    filler = (FILLER * math.ceil(n_filler / len(FILLER)))[:n_filler]
    b = filler_before(n_filler, depth)
    return filler[:b] + KEY_SENTENCE.format(key=key) + filler[b:] + QUESTION, " " + key


def fixed_chars(digits: int) -> int:
    """Characters of an episode without filler (key sentence, question, answer)."""
    prompt, answer = episode_text("0" * digits, 0, 0.0)
    return len(prompt) + len(answer)


def make_episodes(n: int, *, min_len: int, max_len: int, digits: int, seed: int) -> list[str]:
    """`n` episode texts (prompt + answer), lengths uniform in [min_len, max_len] characters (raised to the
    shortest possible episode), depths uniform in [0, 1], keys uniform; the same arguments give the same list."""
    rng = np.random.default_rng([seed, GENERATOR_VERSION])
    fixed = fixed_chars(digits)
    lengths = rng.integers(max(min_len, fixed), max(max_len, fixed) + 1, size=n)  # (n,)
    depths = rng.random(n)  # (n,)
    keys = random_keys(rng, n, digits)
    texts = []
    for key, length, depth in zip(keys, lengths.tolist(), depths.tolist(), strict=True):  # one step per episode
        prompt, answer = episode_text(key, length - fixed, depth)
        texts.append(prompt + answer)
    return texts


def corpus_documents(data: DataConfig) -> tuple[list[str], list[str]]:
    """(train, val) episodes of `data=passkey`: the first round(val_fraction · N) episodes (at least one when
    val_fraction > 0) are the validation split."""
    docs = make_episodes(
        data.passkey_episodes,
        min_len=data.passkey_min_len,
        max_len=data.passkey_max_len,
        digits=data.passkey_digits,
        seed=data.passkey_seed,
    )
    n_val = max(1, round(data.val_fraction * len(docs))) if data.val_fraction > 0 else 0
    n_val = min(n_val, len(docs) - 1)
    return docs[n_val:], docs[:n_val]


def corpus_info(data: DataConfig) -> dict[str, Any]:
    """JSON-safe summary of a passkey corpus; also what its cache fingerprint is made of."""
    return {
        "source": "passkey",
        "generator_version": GENERATOR_VERSION,
        "episodes": data.passkey_episodes,
        "min_len": max(data.passkey_min_len, fixed_chars(data.passkey_digits)),
        "max_len": max(data.passkey_max_len, fixed_chars(data.passkey_digits)),
        "digits": data.passkey_digits,
        "seed": data.passkey_seed,
        "val_fraction": data.val_fraction,
    }


# ----------------------------------------------------------------------------------------------------------------
# Prompts in token space (evaluation).


@dataclass
class PromptBatch:
    """Prompts of one length: every row is exactly `length` tokens once its answer is appended (a row whose answer
    is shorter than the longest gets that many more filler tokens)."""

    prompts: np.ndarray  # (N, P) int64
    answers: np.ndarray  # (N, A) int64, right-padded with -1
    answer_len: np.ndarray  # (N,) int64
    key_start: np.ndarray  # (N,) int64: index of the key sentence's first token in the prompt
    n_filler: np.ndarray  # (N,) int64: filler tokens in the prompt
    keys: list[str]


class PromptTooShort(ValueError):
    """The requested length cannot hold the key sentence, question and answer."""


def split_answer(tokenizer: Tokenizer, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(lead, answer) ids of " KEY": leading whitespace-only tokens belong to the prompt."""
    ids = tokenizer.encode(" " + key)
    k = 0
    while k < len(ids) - 1 and not tokenizer.decode(ids[k : k + 1]).strip():
        k += 1
    return ids[:k], ids[k:]


def build_prompts(tokenizer: Tokenizer, keys: Sequence[str], depths: Sequence[float], length: int) -> PromptBatch:
    """Token prompts of `length` tokens including the answer; raises `PromptTooShort` when no filler fits.

    Each prompt opens with the end-of-document token, as every training document follows one.
    """
    question = tokenizer.encode(QUESTION)
    cycle = tokenizer.encode(FILLER)
    parts = [(tokenizer.encode(KEY_SENTENCE.format(key=k)), *split_answer(tokenizer, k)) for k in keys]
    width = max(len(answer) for _, _, answer in parts)
    P = length - width
    n_filler = np.array([P - 1 - len(sent) - len(question) - len(lead) for sent, lead, _ in parts], dtype=np.int64)
    if len(parts) and n_filler.min() < 0:
        need = length - int(n_filler.min())
        raise PromptTooShort(f"length {length} is shorter than a prompt without filler ({need} tokens)")
    filler = np.tile(cycle, math.ceil(max(int(n_filler.max(initial=0)), 1) / len(cycle)))  # (>= max n_filler,)
    prompts = np.empty((len(parts), P), dtype=np.int64)
    answers = np.full((len(parts), width), -1, dtype=np.int64)
    starts = np.empty(len(parts), dtype=np.int64)
    for i, ((sent, lead, answer), depth) in enumerate(zip(parts, depths, strict=True)):  # one step per prompt
        n = int(n_filler[i])
        b = filler_before(n, float(depth))
        prompts[i] = np.concatenate([[tokenizer.eod_id], filler[:b], sent, filler[b:n], question, lead])
        answers[i, : len(answer)] = answer
        starts[i] = 1 + b
    answer_len = np.array([len(a) for _, _, a in parts], dtype=np.int64)
    return PromptBatch(prompts, answers, answer_len, starts, n_filler, list(keys))


def greedy_decode(model: nn.Module, prompts: torch.Tensor, steps: int, *, use_bf16: bool = False) -> torch.Tensor:
    """Append `steps` argmax tokens to `prompts` (B, P) -> (B, steps); one full forward per step (no KV cache)."""
    x = prompts
    for _ in range(steps):
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(x)  # (B, T, V)
        nxt = logits[:, -1, :].float().argmax(dim=-1, keepdim=True)  # (B, 1)
        x = torch.cat([x, nxt], dim=1)  # (B, T+1)
    return x[:, prompts.shape[1] :]


def exact_match(generated: np.ndarray, answers: np.ndarray, answer_len: np.ndarray) -> np.ndarray:
    """(N,) bool: the first answer_len[i] generated tokens equal the answer (answers padded with -1)."""
    width = answers.shape[1]
    mask = np.arange(width)[None, :] < answer_len[:, None]  # (N, A)
    return ((generated[:, :width] == answers) | ~mask).all(axis=1)


def token_share(generated: np.ndarray, answers: np.ndarray, answer_len: np.ndarray) -> np.ndarray:
    """(N,) float: share of the answer's tokens generated right at their position (partial credit)."""
    width = answers.shape[1]
    mask = np.arange(width)[None, :] < answer_len[:, None]  # (N, A)
    return ((generated[:, :width] == answers) & mask).sum(axis=1) / answer_len


def cell_rng(seed: int, length: int, depth: float) -> np.random.Generator:
    """Keys of one (length, depth) cell depend only on these, not on which other cells are measured."""
    return np.random.default_rng([seed, length, round(depth * 1_000_000)])


def evaluate_passkey_model(
    model: nn.Module,
    tokenizer: Tokenizer,
    *,
    length: int,
    depths: Sequence[float],
    trials: int,
    digits: int = 5,
    seed: int = 0,
    batch_tokens: int = 16384,
    dtype: str = "fp32",
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Accuracy of greedy retrieval at one total `length`, one dict per depth: {depth, trials, correct, accuracy
    (exact match), token_accuracy (answer tokens right at their position), samples}.

    Raises `LengthBeyondScheme` (before any forward) when the model cannot read length - 1 tokens and
    `PromptTooShort` when `length` leaves no room for filler.
    """
    scheme = getattr(model, "scheme", None)
    limit = getattr(scheme, "max_length", None)
    if limit is not None and length - 1 > limit:
        raise LengthBeyondScheme(getattr(scheme, "name", type(scheme).__name__), limit, length - 1)
    keys: list[str] = []
    cell_depths: list[float] = []
    for depth in depths:
        keys += random_keys(cell_rng(seed, length, depth), trials, digits)
        cell_depths += [float(depth)] * trials
    batch = build_prompts(tokenizer, keys, cell_depths, length)
    device = torch.device(device)
    per_batch = max(1, batch_tokens // length)
    steps = batch.answers.shape[1]
    generated = np.empty((len(keys), steps), dtype=np.int64)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for i in range(0, len(keys), per_batch):
                x = torch.from_numpy(batch.prompts[i : i + per_batch]).to(device)  # (B, P)
                out = greedy_decode(model, x, steps, use_bf16=dtype == "bf16")  # (B, A)
                generated[i : i + per_batch] = out.cpu().numpy()
                if progress is not None:
                    progress(f"L={length}", min(i + per_batch, len(keys)), len(keys))
    finally:
        model.train(was_training)
    correct = exact_match(generated, batch.answers, batch.answer_len)  # (N,)
    partial = token_share(generated, batch.answers, batch.answer_len)  # (N,)
    cells = []
    for j, depth in enumerate(depths):
        rows = slice(j * trials, (j + 1) * trials)
        hits = int(correct[rows].sum())
        samples = [
            {"key": keys[r], "output": tokenizer.decode(generated[r, : batch.answer_len[r]])}
            for r in range(rows.start, min(rows.stop, rows.start + SAMPLES_PER_CELL))
        ]
        cells.append(
            {
                "depth": float(depth),
                "trials": trials,
                "correct": hits,
                "accuracy": hits / trials,
                "token_accuracy": round(float(partial[rows].mean()), 6),
                "samples": samples,
            }
        )
    return cells


# ----------------------------------------------------------------------------------------------------------------
# Settings, results file and runs.


@dataclass(kw_only=True)
class PasskeyConfig:
    """Options of `posenc eval-passkey` (flags mirror these fields); digits None = the run's data.passkey_digits."""

    lengths: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0])
    abs_lengths: list[int] | None = None
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    trials: int = 10
    digits: int | None = None
    seed: int = 0
    batch_tokens: int = 16384
    dtype: str = "auto"
    force: bool = False

    def validate(self) -> None:
        EvalConfig(lengths=list(self.lengths), abs_lengths=self.abs_lengths).validate()
        if not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise ConfigError(f"--depths must be fractions in [0, 1], got {self.depths}")
        if self.trials < 1 or self.batch_tokens < 1:
            raise ConfigError("--trials and --batch-tokens must be >= 1")
        if self.digits is not None and not 1 <= self.digits <= 18:
            raise ConfigError(f"--digits must be in [1, 18], got {self.digits}")

    def planned_lengths(self, base_length: int) -> list[tuple[int, float]]:
        return plan_lengths(EvalConfig(lengths=list(self.lengths), abs_lengths=self.abs_lengths), base_length)


def results_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / RESULTS_FILE


def load_passkey_results(run_dir: Path | str) -> dict[str, Any] | None:
    """The stored `eval/passkey.json` of a run, None when absent; CheckpointError when unreadable."""
    return read_results_file(results_path(run_dir), "eval-passkey")


def entry_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    """Two entries measure the same cell when these agree."""
    return (entry["length"], entry["depth"], entry["trials"], entry["digits"], entry["seed"], entry["dtype"])


def _entry(length: int, multiple: float, depth: float, cfg: PasskeyConfig, digits: int, dtype: str) -> dict[str, Any]:
    return {
        "length": length,
        "multiple": multiple,
        "depth": float(depth),
        "trials": cfg.trials,
        "digits": digits,
        "seed": cfg.seed,
        "dtype": dtype,
        "status": "n/a",
        "reason": None,
        "correct": None,
        "accuracy": None,
        "token_accuracy": None,
        "samples": [],
        "posenc_version": __version__,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def evaluate_passkey_run(
    run: LoadedRun,
    cfg: PasskeyConfig,
    *,
    device: str | torch.device | None = None,
    force: bool | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Measure (or reuse) every length × depth cell of `cfg` for a loaded run and store them in eval/passkey.json.

    Returns the results doc restricted to this call's entries (length-major, depth-minor) plus "path" and "reused".
    """
    cfg.validate()
    force = cfg.force if force is None else force
    device = torch.device(device) if device is not None else next(run.model.parameters()).device
    train_length = int(run.meta.get("train_length") or run.config.train.seq_len)
    base_length = int(run.meta.get("base_length") or train_length)
    scheme = str(run.config.pos.name)
    digits = cfg.digits if cfg.digits is not None else run.config.data.passkey_digits
    dtype = resolve_dtype(cfg.dtype, run.meta, device)

    doc = load_passkey_results(run.path) or new_results_doc(run.path.name, scheme, train_length, base_length)
    doc.update(run=run.path.name, scheme=scheme, train_length=train_length, base_length=base_length)
    stored = {entry_key(e): e for e in doc["entries"]}
    selected: list[dict[str, Any]] = []
    reused = 0
    for length, multiple in cfg.planned_lengths(base_length):
        cells = [_entry(length, multiple, d, cfg, digits, dtype) for d in cfg.depths]
        if not force and all(entry_key(c) in stored for c in cells):
            selected += [stored[entry_key(c)] for c in cells]
            reused += len(cells)
            continue
        try:
            measured = evaluate_passkey_model(
                run.model,
                run.tokenizer,
                length=length,
                depths=cfg.depths,
                trials=cfg.trials,
                digits=digits,
                seed=cfg.seed,
                batch_tokens=cfg.batch_tokens,
                dtype=dtype,
                device=device,
                progress=progress,
            )
        except LengthBeyondScheme as e:  # the same reason text as eval-extrapolate
            for c in cells:
                c.update(reason=f"scheme '{e.scheme}' supports at most {e.limit} positions")
        except PromptTooShort as e:
            for c in cells:
                c.update(reason=str(e))
        else:
            for c, m in zip(cells, measured, strict=True):
                c.update(status="ok", **{k: m[k] for k in ("correct", "accuracy", "token_accuracy", "samples")})
        by_key = {entry_key(e): i for i, e in enumerate(doc["entries"])}
        for c in cells:
            if entry_key(c) in by_key:
                doc["entries"][by_key[entry_key(c)]] = c
            else:
                doc["entries"].append(c)
        atomic_write_json(results_path(run.path), doc)  # after every length: a kill loses at most one length
        selected += cells
    out = {k: v for k, v in doc.items() if k != "entries"}
    out.update(path=str(run.path), reused=reused, entries=selected)
    return out


def evaluate_passkey_paths(
    paths: Sequence[Path | str],
    cfg: PasskeyConfig,
    *,
    device: str | torch.device = "auto",
    threads: int = 0,
    force: bool | None = None,
    progress: Progress | None = None,
    on_run: Callable[[Path, int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Find the runs below `paths` and evaluate each in turn (one model in memory at a time)."""
    cfg.validate()

    def evaluate(run: LoadedRun, run_device: torch.device) -> dict[str, Any]:
        return evaluate_passkey_run(run, cfg, device=run_device, force=force, progress=progress)

    return evaluate_each_run(find_runs(paths), evaluate, device=device, threads=threads, on_run=on_run)


# ----------------------------------------------------------------------------------------------------------------
# Rendering (objects only; the CLI prints and saves them).


def accuracy_grid(
    result: dict[str, Any], metric: str = "accuracy"
) -> tuple[list[tuple[int, float]], list[float], np.ndarray, dict[str, str]]:
    """((length, multiple) rows, depth columns, (rows, cols) `metric` with NaN for n/a, {reason: lengths})."""
    rows = sorted({(int(e["length"]), float(e["multiple"])) for e in result["entries"]})
    cols = sorted({float(e["depth"]) for e in result["entries"]})
    grid = np.full((len(rows), len(cols)), np.nan)
    reasons: dict[str, dict[str, None]] = {}  # reason -> lengths (ordered set)
    for e in result["entries"]:
        i, j = rows.index((int(e["length"]), float(e["multiple"]))), cols.index(float(e["depth"]))
        if e.get("status") == "ok" and e.get(metric) is not None:
            grid[i, j] = float(e[metric])
        else:
            reasons.setdefault(e.get("reason") or "not measured", {})[str(e["length"])] = None
    return rows, cols, grid, {r: ", ".join(lengths) for r, lengths in reasons.items()}


def accuracy_colour(accuracy: float) -> str:
    """Red (0) -> yellow (0.5) -> green (1), as a hex colour (ColorBrewer RdYlGn end points)."""
    stops = np.array([[215, 48, 39], [254, 224, 139], [26, 152, 80]], dtype=float)
    t = min(max(accuracy, 0.0), 1.0) * 2
    k = min(int(t), 1)
    rgb = stops[k] + (stops[k + 1] - stops[k]) * (t - k)
    return "#" + "".join(f"{round(c):02x}" for c in rgb)


def _ink(accuracy: float) -> str:
    """Text colour readable on `accuracy_colour(accuracy)`: white on the dark ends, black in the middle."""
    return "white" if accuracy < 0.2 or accuracy > 0.85 else "black"


def _depth_label(depth: float) -> str:
    return f"{depth * 100:g}%"


def _length_label(length: int, multiple: float) -> str:
    return f"{multiple:g}× · {length}"


def passkey_table(results: Sequence[dict[str, Any]]) -> Table:
    """Rows = run × length, columns = depths and their mean; cells coloured by accuracy, n/a dimmed."""
    from rich.table import Table
    from rich.text import Text

    from posenc_cli.report import describe_lengths, run_label

    cols = sorted({float(e["depth"]) for r in results for e in r["entries"]})
    trials = sorted({int(e["trials"]) for r in results for e in r["entries"]})
    table = Table(
        title=f"Passkey retrieval accuracy · trained at {describe_lengths(results)} tokens",
        title_justify="left",
        caption_justify="left",
        header_style="bold",
    )
    table.add_column("run", no_wrap=True, overflow="ellipsis", max_width=LABEL_MAX_WIDTH)
    table.add_column("length \\ depth", justify="right", no_wrap=True)
    for d in cols:
        table.add_column(_depth_label(d), justify="center", no_wrap=True)
    table.add_column("mean", justify="right")
    table.add_column("digits", justify="right")
    notes = []
    for n, r in enumerate(results):
        if n:
            table.add_section()
        rows, rcols, grid, reasons = accuracy_grid(r)
        partial = accuracy_grid(r, "token_accuracy")[2]
        for i, (length, multiple) in enumerate(rows):
            cells: list[Text | str] = [run_label(r) if i == 0 else "", _length_label(length, multiple)]
            for d in cols:
                value = grid[i, rcols.index(d)] if d in rcols else math.nan
                if math.isnan(value):
                    cells.append(Text("n/a", style="dim"))
                else:
                    style = f"bold {_ink(value)} on {accuracy_colour(value)}"
                    cells.append(Text(f" {value:.0%} ", style=style))
            for values in (grid[i], partial[i]):
                full = values.size > 0 and not np.isnan(values).any()
                cells.append(f"{values.mean():.0%}" if full else Text("n/a", style="dim"))
            table.add_row(*cells)
        notes += [f"n/a for {run_label(r)} at {lengths}: {reason}" for reason, lengths in reasons.items()]
    count = "/".join(map(str, trials)) or "0"
    table.caption = "\n".join(
        [
            f"Exact match of the greedily decoded key over {count} trials per cell; columns: key depth (share of "
            "the filler before the key); rows: prompt + answer tokens (multiple of each run's base length); "
            "digits: share of answer tokens right at their position (partial credit), mean over depths.",
            *notes,
        ]
    )
    return fit_to_content(table)


def passkey_figure(results: Sequence[dict[str, Any]]) -> Figure:
    """One accuracy heatmap per run (lengths × depths, RdYlGn from 0 to 1, n/a grey), one shared colour bar."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from posenc_cli.report import describe_lengths, run_label

    n = max(len(results), 1)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(3.6 * ncols + 1.2, 2.9 * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    image = None
    for k, ax in enumerate(axes.flat):
        if k >= len(results):
            ax.set_axis_off()
            continue
        rows, cols, grid, _ = accuracy_grid(results[k])
        image = ax.imshow(np.ma.masked_invalid(grid), cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_facecolor("0.85")
        for (i, j), value in np.ndenumerate(grid):
            text = "n/a" if math.isnan(value) else f"{value:.0%}"
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="0.3" if math.isnan(value) else _ink(value))
        ax.set_xticks(range(len(cols)), [_depth_label(d) for d in cols])
        ax.set_yticks(range(len(rows)), [_length_label(length, m) for length, m in rows])
        ax.set_xlabel("key depth")
        if k % ncols == 0:
            ax.set_ylabel("length (multiple · tokens)")
        ax.set_title(run_label(results[k]), fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), label="exact-match accuracy", shrink=0.9)
    fig.suptitle(f"Passkey retrieval (trained at {describe_lengths(results) if results else '?'} tokens)")
    return fig


def combined_json(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """All runs' results in one JSON-safe document (for --json)."""
    return {"schema_version": SCHEMA_VERSION, "runs": [{k: v for k, v in r.items() if k != "reused"} for r in results]}
