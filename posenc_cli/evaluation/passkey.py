"""Passkey retrieval (Mohtashami & Jaggi 2023, landmark attention; used by YaRN): the evaluation.

The episodes and their text pieces live with the `data=passkey` source (`posenc_cli.data.sources.passkey`).

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

- `posenc eval-passkey` (the task `evaluation.tasks.passkey.PasskeyTask`): for each length × depth, `trials`
  prompts of exactly that many tokens (prompt + answer) with fresh seeded keys, greedy decoding of the answer's
  tokens (batched; one forward per generated token), exact match. Results go to `eval/passkey.json` in the style of
  `eval/extrapolate.json`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from posenc_cli.config import EvalConfig
from posenc_cli.data.sources.passkey import (
    FILLER,
    KEY_SENTENCE,
    QUESTION,
    filler_before,
    random_keys,
)
from posenc_cli.errors import ConfigError, LengthBeyondScheme
from posenc_cli.evaluation.perplexity.planning import plan_lengths
from posenc_cli.evaluation.positions import Positions

if TYPE_CHECKING:
    from posenc_cli.data.tokenizer import Tokenizer

SCHEMA_VERSION = 1
PASSKEY_FILE = Path("eval") / "passkey.json"
SAMPLES_PER_CELL = 3
Progress = Callable[[str, int, int], None]  # (description, done, total)

__all__ = [
    "PASSKEY_FILE",
    "PasskeyConfig",
    "PromptBatch",
    "PromptTooShort",
    "build_prompts",
    "combined_json",
    "decode_ragged",
    "evaluate_passkey_model",
    "exact_match",
    "greedy_decode",
    "left_pad_documents",
    "token_share",
]


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


def greedy_decode(
    model: nn.Module,
    prompts: torch.Tensor,
    steps: int,
    *,
    use_bf16: bool = False,
    position_ids: torch.Tensor | None = None,
    cell_length: int | tuple[int, ...] | None = None,
    pads: torch.Tensor | None = None,
    stop_id: int | None = None,
) -> torch.Tensor:
    """Append `steps` argmax tokens to `prompts` (B, P) -> (B, steps).

    `stop_id`: once every row has generated this token, decoding stops and the remaining columns hold it (a caller
    that cuts each row at its first `stop_id` reads the same text; lm-eval's `generate_until` at the end token).

    `pads` (B,) int: row b's first pads[b] tokens are left padding (prompts of different lengths in one batch,
    posenc's model only): they go in as document −1, training's padding (`GPT.forward`'s documents), so no real token
    sees them and each row decodes as it would alone; `cell_length` then defaults to each row's own P − pads + steps.

    With posenc's model (`new_cache`) the prompt is read once and each generated token by one forward of that
    token against the KV cache (`posenc_cli.kv_cache`: the same logits as a full forward, to rounding); a
    `transformers` checkpoint (`run.hf_run.HFCausalLM.decode_step`) likewise through its own cache, except where
    the cache cannot give the full forward's tokens (a length-dependent rope_type, dynamic or longrope; ids per
    layer): then, as any other model, it is run whole over the prompt and the tokens so far at every step.
    `position_ids` (B, P + steps): the ids of the prompt and of every generated token (a randomized-position run's
    draws, `evaluation.positions`); None: 0..P+steps−1. `cell_length`: the evaluation cell's tokens, which every
    forward of the decode reads (DroPE's cell temperature, `GPT.forward`); None: P + steps.
    """
    if hasattr(model, "new_cache"):
        P = prompts.shape[1]
        cell: int | tuple[int, ...] = P + steps if cell_length is None else cell_length
        if pads is not None and cell_length is None:
            cell = tuple(P - int(n) + steps for n in pads.tolist())
        options = {"use_bf16": use_bf16, "position_ids": position_ids, "cell_length": cell, "pads": pads}
        return _greedy_cached(model, prompts, steps, stop_id=stop_id, **options)
    if pads is not None:
        raise ValueError("left-padded prompts decode through posenc's KV cache only (a model with new_cache)")
    if _own_cache_serves(model, position_ids):
        return _greedy_own_cache(model, prompts, steps, use_bf16=use_bf16, position_ids=position_ids, stop_id=stop_id)
    x = prompts
    for _ in range(steps):
        ids = None if position_ids is None else position_ids[..., : x.shape[1]]  # (B, T) or (B, n_layer, T)
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(x) if ids is None else model(x, position_ids=ids)  # (B, T, V)
        nxt = logits[:, -1, :].float().argmax(dim=-1, keepdim=True)  # (B, 1)
        x = torch.cat([x, nxt], dim=1)  # (B, T+1)
        if _all_stopped(x[:, prompts.shape[1] :], stop_id):
            break
    return _fill_after_stop(x[:, prompts.shape[1] :], steps, stop_id)


def _all_stopped(generated: torch.Tensor, stop_id: int | None) -> bool:
    """Whether every row of `generated` (B, t) holds `stop_id` (never, without one)."""
    return stop_id is not None and bool((generated == stop_id).any(dim=1).all())


def _fill_after_stop(generated: torch.Tensor, steps: int, stop_id: int | None) -> torch.Tensor:
    """(B, t) tokens of a decode that stopped early -> (B, steps), the missing columns `stop_id`."""
    if generated.shape[1] == steps or stop_id is None:
        return generated
    tail = generated.new_full((generated.shape[0], steps - generated.shape[1]), stop_id)  # (B, steps - t)
    return torch.cat([generated, tail], dim=1)


def _greedy_cached(
    model: nn.Module,
    prompts: torch.Tensor,
    steps: int,
    *,
    use_bf16: bool,
    position_ids: torch.Tensor | None,
    cell_length: int | tuple[int, ...],
    pads: torch.Tensor | None = None,
    stop_id: int | None = None,
) -> torch.Tensor:
    """`greedy_decode` through the KV cache (held for a cell of `cell_length` tokens, or one per row): the prompt
    once (its left `pads` as document −1), then one (B, 1) forward per generated token, which continues its row's
    document."""
    cache = model.new_cache(cell_length, room=prompts.shape[1] + steps)
    out = prompts.new_empty(prompts.shape[0], steps)  # (B, steps)
    x, start = prompts, 0
    documents = None if pads is None else left_pad_documents(pads.to(prompts.device), prompts.shape[1])  # (B, P)
    for i in range(steps):
        ids = None if position_ids is None else position_ids[..., start : start + x.shape[1]]  # this forward's
        start += x.shape[1]
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(x, cache=cache, position_ids=ids, documents=documents)  # (B, T, V): prompt, then a token
        documents = None  # later tokens continue each row's document (`KVCache.documents_with`)
        out[:, i] = logits[:, -1, :].float().argmax(dim=-1)
        if _all_stopped(out[:, : i + 1], stop_id):
            return _fill_after_stop(out[:, : i + 1], steps, stop_id)
        x = out[:, i : i + 1]  # (B, 1)
    return out


def left_pad_documents(pads: torch.Tensor, width: int) -> torch.Tensor:
    """(B,) pad counts -> (B, width) int64 document ids: −1 on each row's first pads[b] tokens (training's padding,
    `train.packing=none`), 0 on its prompt."""
    index = torch.arange(width, device=pads.device)  # (width,)
    return torch.where(index[None, :] < pads[:, None], -1, 0).long()  # (B, width)


def _own_cache_serves(model: nn.Module, position_ids: torch.Tensor | None) -> bool:
    """A model with its own KV cache (`decode_step`: a `transformers` checkpoint) that gives the full forward's
    tokens for these ids (one id per token, not per layer; no length-dependent RoPE: `uncached_reason`)."""
    if not hasattr(model, "decode_step"):
        return False
    return (position_ids is None or position_ids.dim() == 2) and model.uncached_reason() is None


def _greedy_own_cache(
    model: nn.Module,
    prompts: torch.Tensor,
    steps: int,
    *,
    use_bf16: bool,
    position_ids: torch.Tensor | None,
    stop_id: int | None = None,
) -> torch.Tensor:
    """`greedy_decode` through the model's own cache (`decode_step`): the prompt once, then one (B, 1) forward per
    generated token, with the ids of each forward's tokens when `position_ids` (B, P + steps) is given."""
    out = prompts.new_empty(prompts.shape[0], steps)  # (B, steps)
    x, start, past = prompts, 0, None
    for i in range(steps):
        ids = None if position_ids is None else position_ids[:, start : start + x.shape[1]]  # (B, T) this forward's
        start += x.shape[1]
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits, past = model.decode_step(x, past, position_ids=ids)  # (B, V): after the prompt, then each token
        out[:, i] = logits.float().argmax(dim=-1)
        if _all_stopped(out[:, : i + 1], stop_id):
            return _fill_after_stop(out[:, : i + 1], steps, stop_id)
        x = out[:, i : i + 1]  # (B, 1)
    return out


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


def check_readable(model: nn.Module, length: int) -> None:
    """Raise `LengthBeyondScheme` (before any forward) when the model's scheme cannot read `length` - 1 tokens."""
    scheme = getattr(model, "scheme", None)
    limit = getattr(scheme, "max_length", None)
    if limit is not None and length - 1 > limit:
        raise LengthBeyondScheme(getattr(scheme, "name", type(scheme).__name__), limit, length - 1)


def decode_prompts(
    model: nn.Module,
    prompts: np.ndarray,
    steps: int,
    length: int,
    batch_tokens: int,
    dtype: str,
    device: str | torch.device,
    progress: Progress | None,
    label: str,
    positions: Positions | None = None,
) -> np.ndarray:
    """Greedy continuations (N, steps) of `prompts` (N, P), `batch_tokens` // `length` rows at a time (`length`:
    prompt + answer tokens); the model is put in eval mode and given back in the mode it came in. `positions`
    random (a run trained with randomized positions): each row reads at its own sorted draw of P + steps ids from
    [0, M), row by row from one generator seeded by (seed, P + steps), so the batch size changes nothing; the
    caller checks `positions.beyond_range` first."""
    device = torch.device(device)
    n, width = prompts.shape
    per_batch = max(1, batch_tokens // length)
    generated = np.empty((n, steps), dtype=np.int64)
    draws = positions.generator(width + steps) if positions is not None and positions.random else None
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for i in range(0, n, per_batch):
                x = torch.from_numpy(prompts[i : i + per_batch]).to(device)  # (B, P)
                ids = None
                if draws is not None and positions is not None:
                    ids = positions.draw(len(x), width + steps, draws).to(device)  # (B, P + steps)
                out = greedy_decode(
                    model, x, steps, use_bf16=dtype == "bf16", position_ids=ids, cell_length=length
                )  # (B, steps)
                generated[i : i + per_batch] = out.cpu().numpy()
                if progress is not None:
                    progress(label, min(i + per_batch, n), n)
    finally:
        model.train(was_training)
    return generated


def decode_ragged(
    model: nn.Module,
    prompts: Sequence[np.ndarray],
    steps: Sequence[int],
    cells: Sequence[int],
    batch_tokens: int,
    dtype: str,
    device: str | torch.device,
    progress: Progress | None,
    label: str,
    position_ids: Sequence[torch.Tensor] | None = None,
    stop_id: int | None = None,
) -> list[np.ndarray]:
    """Greedy continuations of prompts of any lengths: row i (`prompts[i]` (P_i,)) gets `steps[i]` tokens, read as an
    evaluation cell of `cells[i]` tokens, with `position_ids[i]` ((P_i + steps_i,) or (layers, P_i + steps_i); None:
    0..P_i + steps_i − 1) -> one (steps_i,) array per row.

    Rows go by length (longest first) into batches of `batch_tokens` // the longest row's tokens, each left-padded to
    its longest prompt (`greedy_decode`'s `pads`): a cell whose prompts differ in length decodes in as few batches as
    one of equal prompts, each row as it would alone. A batch decodes its most steps; a row past its own keeps its
    last id for the extra tokens (never read: a learned table's limit is the row's), whose tokens are dropped. A
    model without posenc's KV cache (a `transformers` checkpoint) takes the prompts of one length together, unpadded.
    The model is put in eval mode and given back in the mode it came in. `stop_id`: a batch stops once each of its rows
    has generated it (`greedy_decode`)."""
    device = torch.device(device)
    n = len(prompts)
    out: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * n
    if n == 0:
        return out
    widths = [len(p) + s for p, s in zip(prompts, steps, strict=True)]
    per_batch = max(1, batch_tokens // max(widths))
    order = sorted(range(n), key=lambda i: -len(prompts[i]))  # similar lengths share a batch: few pads
    if hasattr(model, "new_cache"):
        batches = [order[b : b + per_batch] for b in range(0, n, per_batch)]
    else:  # no padding without posenc's cache: one length (and budget) at a time
        groups: dict[tuple[int, int], list[int]] = {}
        for i in order:
            groups.setdefault((len(prompts[i]), int(steps[i])), []).append(i)
        batches = [g[b : b + per_batch] for g in groups.values() for b in range(0, len(g), per_batch)]
    was_training = model.training
    model.eval()
    done = 0
    try:
        with torch.inference_mode():
            for rows in batches:
                row_ids = None if position_ids is None else [position_ids[i] for i in rows]
                x, pads, ids, S = padded_batch([prompts[i] for i in rows], [int(steps[i]) for i in rows], row_ids)
                cell = tuple(int(cells[i]) for i in rows)
                generated = greedy_decode(
                    model,
                    x.to(device),
                    S,
                    use_bf16=dtype == "bf16",
                    position_ids=None if ids is None else ids.to(device),
                    cell_length=cell if len(set(cell)) > 1 else cell[0],
                    pads=None if pads is None else pads.to(device),
                    stop_id=stop_id,
                )  # (B, S)
                for r, i in enumerate(rows):
                    out[i] = generated[r, : int(steps[i])].cpu().numpy()
                done += len(rows)
                if progress is not None:
                    progress(label, done, n)
    finally:
        model.train(was_training)
    return out


def padded_batch(
    prompts: Sequence[np.ndarray], steps: Sequence[int], position_ids: Sequence[torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, int]:
    """Prompts (P_i,) -> (tokens (B, P) left-padded with each row's first token, pads (B,) or None when no row is
    padded, ids (B, P + S) or (B, layers, P + S) or None, S the most steps). Ids: 0 on the pads, then the row's own
    (`position_ids[i]`, else 0..P_i + steps_i − 1, given explicitly only when some row has fewer steps than S or ids
    were given), its last id repeated on its extra steps."""
    P, S = max(len(p) for p in prompts), max(steps)
    pad = [P - len(p) for p in prompts]
    x = torch.from_numpy(np.stack([np.pad(p, (n, 0), mode="edge") for p, n in zip(prompts, pad, strict=True)]))
    pads = torch.tensor(pad, dtype=torch.long) if any(pad) else None
    ids = None
    if position_ids is not None or min(steps) < S:
        rows = []
        for i, (p, s) in enumerate(zip(prompts, steps, strict=True)):
            own = torch.arange(len(p) + s) if position_ids is None else position_ids[i].long()  # (..., P_i + s)
            extra = own[..., -1:].expand(*own.shape[:-1], S - s)  # the last id, on steps past the row's own
            zeros = own.new_zeros(*own.shape[:-1], pad[i])
            rows.append(torch.cat([zeros, own, extra], dim=-1))  # (..., P + S)
        ids = torch.stack(rows)  # (B, P + S) or (B, layers, P + S)
    return x, pads, ids, S


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
    positions: Positions | None = None,
) -> list[dict[str, Any]]:
    """Accuracy of greedy retrieval at one total `length`, one dict per depth: {depth, trials, correct, accuracy
    (exact match), token_accuracy (answer tokens right at their position), samples}. `positions`: the ids fed
    (`decode_prompts`; default 0..length−1).

    Raises `LengthBeyondScheme` (before any forward) when the model cannot read length - 1 tokens and
    `PromptTooShort` when `length` leaves no room for filler.
    """
    check_readable(model, length)
    keys: list[str] = []
    cell_depths: list[float] = []
    for depth in depths:
        keys += random_keys(cell_rng(seed, length, depth), trials, digits)
        cell_depths += [float(depth)] * trials
    batch = build_prompts(tokenizer, keys, cell_depths, length)
    generated = decode_prompts(
        model,
        batch.prompts,
        batch.answers.shape[1],
        length,
        batch_tokens,
        dtype,
        device,
        progress,
        f"L={length}",
        positions=positions,
    )
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


def validate_grid(cfg: Any) -> None:
    """The settings a retrieval evaluation shares (`PasskeyConfig`, eval-tasks' `TasksEvalConfig`): lengths,
    depths in [0, 1], trials, batch tokens and digits; one-line `ConfigError`s naming the flag."""
    EvalConfig(lengths=list(cfg.lengths), abs_lengths=cfg.abs_lengths).validate()
    if not cfg.depths or any(not 0.0 <= d <= 1.0 for d in cfg.depths):
        raise ConfigError(f"--depths must be fractions in [0, 1], got {cfg.depths}")
    if cfg.trials < 1 or cfg.batch_tokens < 1:
        raise ConfigError("--trials and --batch-tokens must be >= 1")
    if cfg.digits is not None and not 1 <= cfg.digits <= 18:
        raise ConfigError(f"--digits must be in [1, 18], got {cfg.digits}")


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
        validate_grid(self)

    def planned_lengths(self, base_length: int) -> list[tuple[int, float]]:
        return plan_lengths(EvalConfig(lengths=list(self.lengths), abs_lengths=self.abs_lengths), base_length)


def results_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / PASSKEY_FILE


def combined_json(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """All runs' results in one JSON-safe document (for --json)."""
    return {"schema_version": SCHEMA_VERSION, "runs": [{k: v for k, v in r.items() if k != "reused"} for r in results]}
