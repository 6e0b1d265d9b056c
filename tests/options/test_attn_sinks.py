"""Learned attention sinks (posenc_cli/options/attn_sinks.py): the sheet's identities, the kernel choice (every
fused road gives way to one that forms the weights), sliding layers keep the sink, and a scheme without a softmax
is refused in one line."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from options_reference import reference_logits
from test_contract_options import TINY, VOCAB, tokens

from posenc_cli.attention.choose import choose_kernel
from posenc_cli.attention.kernels import Remapped
from posenc_cli.attention.scored import Scored
from posenc_cli.attention.spec import KernelSpec
from posenc_cli.errors import ConfigError
from posenc_cli.model import GPT
from posenc_cli.options.attn_sinks import sink_softmax
from posenc_cli.positional import config_class
from posenc_cli.positional.layout import LayoutConfig
from posenc_cli.positional.span import Span


def logits(seed: int = 0) -> torch.Tensor:
    s = torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(seed))
    return s.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))  # causal (2, 3, 5, 5)


def test_a_sink_at_minus_infinity_is_the_plain_softmax() -> None:
    s = logits()
    torch.testing.assert_close(sink_softmax(s, torch.full((3,), -1e30)), torch.softmax(s, -1), atol=0, rtol=0)


def test_rows_sum_to_sigmoid_of_logsumexp_minus_sink() -> None:
    s, b = logits(), torch.tensor([-1.0, 0.0, 2.0])
    expected = torch.sigmoid(s.logsumexp(-1) - b.view(1, 3, 1))  # (2, 3, 5)
    torch.testing.assert_close(sink_softmax(s, b).sum(-1), expected, atol=1e-6, rtol=0)
    assert (sink_softmax(s, b).sum(-1) < 1).all()


def test_a_sink_is_one_more_key_with_logit_b_and_a_zero_value() -> None:
    s, b, v = logits(), torch.tensor([0.5, -0.3, 1.2]), torch.randn(2, 3, 5, 4)
    extra = torch.cat([s, b.view(1, 3, 1, 1).expand(2, 3, 5, 1)], -1)  # the sink as key 5
    v_extra = torch.cat([v, torch.zeros(2, 3, 1, 4)], 2)  # its value: zero
    torch.testing.assert_close(sink_softmax(s, b) @ v, torch.softmax(extra, -1) @ v_extra, atol=1e-6, rtol=0)


ROADS = dict(has_bias=[False, True], offers_key_bias=[False, True], q_start=[0, 7], documents=[False, True],
             span=[Span("full"), Span("sliding", 4), Span("chunked", 4)], owns_scores=[False, True])  # fmt: skip


@pytest.mark.parametrize("facts", [dict(zip(ROADS, v, strict=True)) for v in itertools.product(*ROADS.values())])
def test_every_spec_with_sinks_takes_a_road_that_forms_the_weights(facts: dict) -> None:
    spec = KernelSpec(dtype=torch.float32, device="cpu", seq_len=8, sinks=True, **facts)
    kernel = choose_kernel(spec)
    assert isinstance(kernel, Scored) and kernel.sinks
    remapped = choose_kernel(dataclasses.replace(spec, remap=True, owns_scores=False))
    assert isinstance(remapped, Remapped) and remapped.sinks
    assert not getattr(choose_kernel(dataclasses.replace(spec, sinks=False)), "sinks", False)


def test_bf16_training_with_sinks_runs_the_scored_road_in_fp32() -> None:
    spec = KernelSpec(dtype=torch.bfloat16, device="cpu", seq_len=8, needs_grad=True, sinks=True, has_bias=False)
    kernel = choose_kernel(spec)
    assert isinstance(kernel.inner, Scored) and kernel.inner.sinks


def test_sliding_layers_keep_the_sink_and_equal_the_reference() -> None:
    """A layout of a sliding (W = 4) and a full RoPE layer: the sink joins the windowed rows too."""
    pos = LayoutConfig(layers=[{"name": "rope", "span": "sliding", "window": 4}, {"name": "rope"}])
    torch.manual_seed(0)
    m = GPT(dataclasses.replace(TINY, attn_sinks=True), pos, VOCAB, 16).eval()
    with torch.no_grad():
        for block in m.blocks:
            block.options["attn_sinks"].sinks.copy_(torch.tensor([1.5, -0.5]))
        idx = tokens()
        torch.testing.assert_close(m(idx), reference_logits(m, idx, windows=[4, None]), atol=1e-5, rtol=0)
        with_sinks = m(idx)
        for block in m.blocks:  # the sinks act: far below every logit they change nothing
            block.options["attn_sinks"].sinks.fill_(-1e4)
        assert not torch.allclose(m(idx), with_sinks, atol=1e-3)


def test_sink_logits_are_per_head_and_start_small() -> None:
    torch.manual_seed(0)
    m = GPT(dataclasses.replace(TINY, n_layer=8, n_head=4, attn_sinks=True), config_class("rope")(), VOCAB, 16)
    sinks = torch.stack([b.options["attn_sinks"].sinks for b in m.blocks])  # (8, 4)
    assert sinks.shape == (8, 4) and 0.005 < sinks.std() < 0.05  # N(0, init_std = 0.02)


def test_a_scheme_that_replaces_the_softmax_is_refused_sinks() -> None:
    with pytest.raises(ConfigError, match="replaces the softmax"):
        GPT(dataclasses.replace(TINY, attn_sinks=True), config_class("stickbreaking")(), VOCAB, 16)
