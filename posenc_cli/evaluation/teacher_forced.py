"""Teacher-forced scoring of the algorithmic tasks whose reference scores many positions of one sequence (MQAR's
values after the queries, flip-flop's bits after the reads: `Example.scored`), for `posenc eval-algorithmic`.

The whole document `<eod> text` is read in one forward, and the greedy (argmax) prediction of every token of a scored
piece is compared with that token, each prediction seeing the true text before it, as the references score
(HazyResearch/zoology d88d6f5, `zoology/train.py:210-224`: argmax at the non-ignored positions of the true input;
flip-flop: the share of read bits mispredicted, Liu et al. 2023). A piece (one reference token: ` E`, ` 1`) is right
when all its tokens are. A cell records `token_accuracy` = right pieces / scored pieces over the cell (the
references' per-query / per-read accuracy; for MQAR every example of a cell has the same number of queries, so this is
also Zoology's mean of per-example shares) and `accuracy` = the share of examples with every piece right (exact match
of the whole sequence, what the other tasks' `accuracy` means).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from posenc_cli.data.algorithmic.base import Example
from posenc_cli.evaluation.passkey import check_readable
from posenc_cli.evaluation.positions import BeyondRange, Positions

if TYPE_CHECKING:
    from torch import nn

    from posenc_cli.data.tokenizer import Tokenizer

SAMPLES_PER_CELL = 3
Progress = Callable[[str, int, int], None]  # (description, done, total)


def piece_spans(tokenizer: Tokenizer, example: Example) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """(the document's ids with the leading end-of-document token (T,), the [start, end) id ranges of its scored
    pieces). Raises ValueError when the tokenizer cuts the text elsewhere than at a piece boundary."""
    whole = np.asarray(tokenizer.encode(example.text), dtype=np.int64)
    spans: list[tuple[int, int]] = []
    prefix, start = "", 0
    for text, scored in example.pieces:  # one step per piece
        prefix += text
        head = np.asarray(tokenizer.encode(prefix), dtype=np.int64)
        if not np.array_equal(head, whole[: len(head)]):
            raise ValueError(f"the tokenizer does not cut {example.text!r} after {prefix!r}")
        if scored:
            spans.append((start + 1, len(head) + 1))  # +1: the leading end-of-document token
        start = len(head)
    return np.concatenate([[tokenizer.eod_id], whole]), spans


def predict(
    model: nn.Module, rows: np.ndarray, dtype: str, device: torch.device, position_ids: torch.Tensor | None
) -> np.ndarray:
    """Argmax next-token predictions (B, T) of `rows` (B, T): prediction t is of token t + 1."""
    x = torch.from_numpy(rows).to(device)  # (B, T)
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
        logits = model(x) if position_ids is None else model(x, position_ids=position_ids.to(device))  # (B, T, V)
    return logits.float().argmax(dim=-1).cpu().numpy()


def evaluate_scored_cell(
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
    """Teacher-forced scores of `examples` (each with `scored` pieces): {correct, accuracy, token_accuracy, tokens,
    samples}, as `evaluation.algorithmic.evaluate_cell` returns them (see the module docstring for what each means).
    Raises `LengthBeyondScheme` / `BeyondRange` before any forward, as that function does."""
    device = torch.device(device)
    encoded = [piece_spans(tokenizer, e) for e in examples]
    tokens = max(len(ids) for ids, _ in encoded) + 1  # with the closing end token, as `evaluate_cell` counts
    check_readable(model, tokens)  # it reads every token but the closing one
    if positions is not None and (beyond := positions.beyond_range(tokens)) is not None:
        raise BeyondRange(beyond)
    right = np.zeros(len(examples), dtype=np.int64)  # per example: scored pieces right
    total = np.array([len(spans) for _, spans in encoded], dtype=np.int64)
    outputs = [""] * len(examples)
    by_width: dict[int, list[int]] = {}
    for i, (ids, _) in enumerate(encoded):
        by_width.setdefault(len(ids), []).append(i)
    was_training = model.training
    model.eval()
    done = 0
    try:
        with torch.inference_mode():
            for width, members in sorted(by_width.items()):  # one shape per length: no padding
                draws = positions.generator(width) if positions is not None and positions.random else None
                per_batch = max(1, batch_tokens // width)
                for b in range(0, len(members), per_batch):
                    chunk = members[b : b + per_batch]
                    rows = np.stack([encoded[i][0] for i in chunk])  # (B, T)
                    ids = positions.draw(len(chunk), width, draws) if draws is not None and positions else None
                    predicted = predict(model, rows, dtype, device, ids)  # (B, T)
                    for r, i in enumerate(chunk):
                        target, spans = encoded[i]
                        hits = [np.array_equal(predicted[r, s - 1 : e - 1], target[s:e]) for s, e in spans]
                        right[i] = sum(hits)
                        outputs[i] = "".join(tokenizer.decode(predicted[r, s - 1 : e - 1]) for s, e in spans)
                    done += len(chunk)
                    if progress is not None:
                        progress(label, done, len(examples))
    finally:
        model.train(was_training)
    samples = [
        {"prompt": e.prompt, "answer": "".join(t for t, scored in e.pieces if scored), "output": outputs[i]}
        for i, e in enumerate(examples[:SAMPLES_PER_CELL])
    ]
    correct = int(np.sum(right == total))
    return {
        "correct": correct,
        "accuracy": correct / len(examples),
        "token_accuracy": float(right.sum() / max(1, total.sum())),
        "tokens": int(tokens),
        "samples": samples,
    }
