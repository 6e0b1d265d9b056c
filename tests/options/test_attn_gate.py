"""Output gate (posenc_cli/options/attn_gate.py): widths, σ ≈ 0.5 at initialisation, and a gate that closes."""

from __future__ import annotations

import dataclasses

import torch
from test_contract_options import TINY, VOCAB, tokens

from posenc_cli.model import GPT
from posenc_cli.options.attn_gate import gated
from posenc_cli.positional import config_class


def test_gate_widths_elementwise_and_headwise() -> None:
    for kind, width in (("elementwise", TINY.d_model), ("headwise", TINY.n_head)):
        m = GPT(dataclasses.replace(TINY, attn_gate=kind), config_class("rope")(), VOCAB, 16)
        assert m.blocks[0].options["attn_gate"].proj.weight.shape == (width, TINY.d_model)


def test_a_closed_gate_removes_the_attention_sublayer() -> None:
    y = torch.randn(2, 3, 4, 8)
    assert torch.equal(gated(y, torch.full((2, 3, 4, 1), -1e4)), torch.zeros_like(y))
    torch.testing.assert_close(gated(y, torch.zeros(2, 3, 4, 8)), y / 2)


def test_gates_start_near_one_half() -> None:
    torch.manual_seed(0)
    m = GPT(dataclasses.replace(TINY, attn_gate="elementwise"), config_class("rope")(), VOCAB, 16)
    gate = m.blocks[0].options["attn_gate"]
    with torch.no_grad():
        x = m.blocks[0].norm1(m.wte(tokens()))
        logits = gate.proj(x)  # std ≈ init_std·√D for unit-RMS inputs (the sheet's derivation)
        assert abs(logits.std() - 0.02 * TINY.d_model**0.5) < 0.05 and abs(torch.sigmoid(logits).mean() - 0.5) < 0.02
