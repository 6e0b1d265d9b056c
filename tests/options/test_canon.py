"""Canon layers (posenc_cli/options/canon.py): the convolution is PhysicsLM4's Conv1d (padding K − 1, first T
outputs), packed rows convolve within their documents, and the init is Conv1d's default."""

from __future__ import annotations

import dataclasses

import torch
from options_reference import conv_reference
from test_contract_options import TINY, VOCAB, model

from posenc_cli.model import GPT
from posenc_cli.options.canon import KERNEL, causal_conv
from posenc_cli.positional import config_class


def test_causal_conv_is_the_references_conv1d() -> None:
    h, w = torch.randn(2, 9, 6), torch.randn(6, 1, KERNEL)
    torch.testing.assert_close(h + causal_conv(h, w), conv_reference(h, w), atol=1e-6, rtol=0)


def test_no_tap_crosses_a_document() -> None:
    h, w = torch.randn(1, 9, 6), torch.randn(6, 1, KERNEL)
    local = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0]])  # documents [0, 5), [5, 8), [8, 9)
    out = causal_conv(h, w, local)
    for lo, hi in ((0, 5), (5, 8), (8, 9)):
        torch.testing.assert_close(out[:, lo:hi], causal_conv(h[:, lo:hi], w), atol=1e-6, rtol=0)


def test_a_packed_documents_logits_are_its_own() -> None:
    m = model("rope", canon="ABCD")
    a, b = torch.randint(0, VOCAB, (1, 7)), torch.randint(0, VOCAB, (1, 6))
    docs = torch.tensor([[0] * 7 + [1] * 6])
    with torch.no_grad():
        packed = m(torch.cat([a, b], 1), documents=docs)
        torch.testing.assert_close(packed[:, 7:], m(b), atol=1e-5, rtol=0)
        torch.testing.assert_close(packed[:, :7], m(a), atol=1e-5, rtol=0)


def test_weights_start_as_conv1d_defaults_at_each_placements_width() -> None:
    torch.manual_seed(0)
    cfg = dataclasses.replace(TINY, canon="ABCD")
    convs = GPT(cfg, config_class("nope")(), VOCAB, 16).blocks[0].options["canon"].convs
    D = cfg.d_model
    widths = {"a": D, "b": 3 * D, "c": D, "d": cfg.mlp_ratio * D}
    assert {p: c.weight.shape for p, c in convs.items()} == {p: (w, 1, KERNEL) for p, w in widths.items()}
    w = convs["d"].weight
    assert w.abs().max() <= KERNEL**-0.5 and w.std() > 0.25  # U(−0.5, 0.5): std 0.289
