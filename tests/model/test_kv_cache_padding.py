"""Left-padded batches through the KV cache (posenc_cli/kv_cache.py's documents; issue #42 item 3): prompts of
different lengths in one batch, pads as training's −1 documents, decode as each prompt alone, for every registered
scheme and layout (a new scheme file is tested here with no edit); pads change no logit of a real token."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from scheme_utils import lively

from posenc_cli.attention import KernelSpec, choose_kernel
from posenc_cli.attention.kernels import LastRow, Rows
from posenc_cli.config import ModelConfig
from posenc_cli.evaluation.passkey import greedy_decode, left_pad_documents
from posenc_cli.model import GPT
from posenc_cli.positional import config_class, registry

SCHEMES = sorted(registry())
TINY = ModelConfig(d_model=32, n_layer=2, n_head=2)
VOCAB = 48
TRAIN_LENGTH = 16
ATOL = 1e-5
LENGTHS = (9, 5, 12)  # prompts of one batch; with STEPS tokens each reaches the training length at most
STEPS = 4


def make(pos, model: ModelConfig = TINY) -> GPT:
    """A lively model of `pos`, deep enough for a layout's whole pattern."""
    torch.manual_seed(0)
    model = dataclasses.replace(model, n_layer=max(model.n_layer, len(getattr(pos, "layers", ()))))
    return lively(GPT(model, pos, VOCAB, TRAIN_LENGTH))


def prompts(lengths: tuple[int, ...] = LENGTHS, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in lengths]


def left_padded(rows: list[torch.Tensor], fill: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (B, P), pads (B,)): each row right-aligned, its pads `fill` (None: random tokens)."""
    P = max(len(r) for r in rows)
    x = torch.randint(0, VOCAB, (len(rows), P), generator=torch.Generator().manual_seed(99))
    if fill is not None:
        x.fill_(fill)
    for b, r in enumerate(rows):
        x[b, P - len(r) :] = r
    return x, torch.tensor([P - len(r) for r in rows])


def decode_logits(model: GPT, x: torch.Tensor, steps: int, **forward) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding through one cache -> (tokens (B, steps), each step's last-row logits (B, steps, V))."""
    cache = model.new_cache(forward.pop("cell_length", None))
    tokens, logits = [], []
    with torch.no_grad():
        step = model(x, cache=cache, **forward)[:, -1]  # (B, V)
        for _ in range(steps):
            logits.append(step)
            tokens.append(step.argmax(-1))
            if len(tokens) < steps:
                step = model(tokens[-1][:, None], cache=cache)[:, -1]
    return torch.stack(tokens, 1), torch.stack(logits, 1)


@pytest.mark.parametrize("name", SCHEMES)
def test_a_left_padded_batch_decodes_as_each_prompt_alone(name: str) -> None:
    """Tokens identical and logits within 1e-5 (fp32) at every step, each row read as its own cell."""
    model = make(config_class(name)())
    rows = prompts()
    x, pads = left_padded(rows)
    cells = tuple(len(r) + STEPS for r in rows)
    docs = left_pad_documents(pads, x.shape[1])
    tokens, logits = decode_logits(model, x, STEPS, documents=docs, cell_length=cells)
    for b, row in enumerate(rows):
        alone_tokens, alone_logits = decode_logits(model, row[None], STEPS, cell_length=cells[b])
        assert torch.equal(tokens[b], alone_tokens[0]), f"row {b}"
        torch.testing.assert_close(logits[b], alone_logits[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", SCHEMES)
def test_padding_changes_no_logit_of_a_real_token(name: str) -> None:
    """A full forward over a left-padded batch: every real token's logits are its prompt's alone (1e-5), whatever
    the pads hold (two fillings agree to 1e-6): pads are neither attended, scored nor summed in any gate."""
    model = make(config_class(name)())
    rows = prompts(seed=1)
    x, pads = left_padded(rows)
    other, _ = left_padded(rows, fill=3)
    docs = left_pad_documents(pads, x.shape[1])
    with torch.no_grad():
        padded = model(x, documents=docs)  # (B, P, V)
        refilled = model(other, documents=docs)
        for b, row in enumerate(rows):
            alone = model(row[None])[0]  # (n, V)
            torch.testing.assert_close(padded[b, int(pads[b]) :], alone, atol=ATOL, rtol=0)
            torch.testing.assert_close(refilled[b, int(pads[b]) :], padded[b, int(pads[b]) :], atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["rope", "alibi", "xpos"])
def test_left_padded_rows_with_explicit_ids_decode_as_alone(name: str) -> None:
    """Randomized positions: each row's own sorted ids after its pads (ids of pads: 0) give its logits alone."""
    model = make(config_class(name)())
    rows = prompts()
    x, pads = left_padded(rows)
    P = x.shape[1]
    g = torch.Generator().manual_seed(5)
    own = [torch.randperm(TRAIN_LENGTH, generator=g)[: len(r) + STEPS].sort().values for r in rows]
    ids = torch.stack([torch.cat([torch.zeros(int(n), dtype=torch.long), o]) for o, n in zip(own, pads, strict=True)])
    cells = tuple(len(r) + STEPS for r in rows)
    with torch.no_grad():
        padded = greedy_decode(model, x, STEPS, position_ids=ids, pads=pads)  # (B, STEPS)
        for b, row in enumerate(rows):
            alone = greedy_decode(model, row[None], STEPS, position_ids=own[b][None], cell_length=cells[b])
            assert torch.equal(padded[b], alone[0])
    assert max(LENGTHS) == P


def test_a_cell_temperature_reads_each_rows_own_cell() -> None:
    """DroPE's cell β (`temperatures.drope`) from each row's cell length: rows of cells 9 + 4 and 12 + 4 tokens in
    one batch get the β each gets alone (past the training length the two differ)."""
    model = make(
        config_class("nope")(), dataclasses.replace(TINY, attn_scale="drope", temperature_c=2.0, logn_length=4)
    )
    rows = prompts()
    x, pads = left_padded(rows)
    with torch.no_grad():
        padded = greedy_decode(model, x, STEPS, pads=pads)
        for b, row in enumerate(rows):
            assert torch.equal(padded[b], greedy_decode(model, row[None], STEPS)[0])
        _, shared = decode_logits(model, x, 1, documents=left_pad_documents(pads, x.shape[1]))  # one cell, P + 1
        _, own = decode_logits(model, x, 1, documents=left_pad_documents(pads, x.shape[1]), cell_length=(13, 9, 16))
    assert not torch.allclose(shared[1], own[1])  # the row of 5 tokens: its own cell, not the batch's


def test_the_new_rows_of_a_padded_batch_take_a_road_that_masks_pads() -> None:
    """`LastRow` masks nothing: a one-token step over left-padded rows takes `Rows`."""
    spec = KernelSpec(has_bias=False, dtype=torch.float32, device="cpu", seq_len=10, batch=2, n_head=2, q_start=9)
    assert isinstance(choose_kernel(spec), LastRow)
    assert isinstance(choose_kernel(dataclasses.replace(spec, documents=True)), Rows)
