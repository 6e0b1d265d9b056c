"""eval-algorithmic's decoding (posenc_cli/evaluation/algorithmic.py): a cell's prompts of different lengths decode in
one left-padded batch (`passkey.decode_ragged`) and the cell records what decoding one prompt length at a time
recorded (issue #42 item 3), fixed seed, tiny model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scheme_utils import lively

from posenc_cli.config import ModelConfig
from posenc_cli.data.tokenizer import ByteTokenizer
from posenc_cli.evaluation import algorithmic, passkey
from posenc_cli.evaluation.algorithmic import cell_examples, encode_example, evaluate_cell, until_end
from posenc_cli.evaluation.positions import Positions
from posenc_cli.model import GPT
from posenc_cli.positional import config_class

TINY = ModelConfig(d_model=32, n_layer=2, n_head=2)
TASK, LENGTH, EXAMPLES = "polynomial", 2, 12  # prompts of several token lengths in one cell (bytes)


def model(name: str, model_cfg: ModelConfig = TINY) -> GPT:
    torch.manual_seed(0)
    return lively(GPT(model_cfg, config_class(name)(), ByteTokenizer.vocab_size, 64))


def one_length_at_a_time(net: GPT, examples: list, batch_tokens: int, positions: Positions | None) -> dict:
    """The cell as eval-algorithmic measured it before prompts were padded: one decode per prompt length (each with
    its longest answer's steps, its own cell length and its own position draws), `evaluate_cell`'s fields."""
    tokenizer = ByteTokenizer()
    encoded = [encode_example(tokenizer, e) for e in examples]
    right = np.zeros(len(examples), dtype=bool)
    matched = np.zeros(len(examples))
    outputs: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(examples)
    by_width: dict[int, list[int]] = {}
    for i, (p, _) in enumerate(encoded):
        by_width.setdefault(len(p), []).append(i)
    for width, rows in sorted(by_width.items()):
        prompts = np.stack([encoded[i][0] for i in rows])
        steps = max(len(encoded[i][1]) for i in rows)
        generated = passkey.decode_prompts(
            net, prompts, steps, width + steps, batch_tokens, "fp32", "cpu", None, "", positions=positions
        )
        for r, i in enumerate(rows):
            answer = encoded[i][1]
            right[i] = np.array_equal(generated[r, : len(answer)], answer)
            matched[i] = float(np.mean(generated[r, : len(answer)] == answer))
            outputs[i] = generated[r]
    samples = [
        {"prompt": e.prompt, "answer": e.answer, "output": tokenizer.decode(until_end(outputs[i], tokenizer.eod_id))}
        for i, e in enumerate(examples[: algorithmic.SAMPLES_PER_CELL])
    ]
    tokens = max(len(p) + len(a) for p, a in encoded)
    correct = int(right.sum())
    return {
        "correct": correct,
        "accuracy": correct / len(examples),
        "token_accuracy": float(matched.mean()),
        "tokens": int(tokens),
        "samples": samples,
    }


@pytest.mark.parametrize(
    ("name", "positions", "model_cfg"),
    [
        ("rope", None, TINY),
        ("alibi", Positions("random", 160, 0), TINY),
        ("nope", None, dataclasses.replace(TINY, attn_scale="drope", temperature_c=1.0, logn_length=16)),
    ],
    ids=["rope", "alibi-random-positions", "nope-drope-cell"],
)
def test_a_cell_of_mixed_prompt_lengths_records_what_one_length_at_a_time_did(
    name: str, positions: Positions | None, model_cfg: ModelConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    examples = cell_examples(TASK, LENGTH, EXAMPLES, seed=0)
    widths = {len(encode_example(ByteTokenizer(), e)[0]) for e in examples}
    assert len(widths) > 1  # the cell mixes prompt lengths, or this test proves nothing
    net = model(name, model_cfg)
    batch_tokens = 4096
    before = one_length_at_a_time(net, examples, batch_tokens, positions)
    calls: list[int] = []
    inner = passkey.greedy_decode

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return inner(*args, **kwargs)

    monkeypatch.setattr(passkey, "greedy_decode", counted)
    after = evaluate_cell(net, ByteTokenizer(), examples, batch_tokens=batch_tokens, positions=positions)
    assert after == before
    assert len(calls) == 1  # every prompt length in one batch
