"""T5 relative bias: buckets equal transformers' `T5Attention._relative_position_bucket`, one table for all layers."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from posenc_cli.config import ModelConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional import PositionContext
from posenc_cli.positional.t5 import T5Bias, T5Config, relative_position_bucket
from posenc_cli.run.config_load import config_from_dict

REL = torch.arange(-2000, 2001)  # j − i, HF's sign convention


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64), (64, 256), (8, 20), (33, 100)])
def test_buckets_equal_transformers(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    ref = T5Attention._relative_position_bucket(
        REL, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    ours = relative_position_bucket(REL, bidirectional, num_buckets, max_distance)
    assert ours.dtype == torch.int64
    assert torch.equal(ours, ref)


def test_causal_buckets_follow_the_reference_sheet() -> None:
    n = torch.arange(0, 2001)
    buckets = relative_position_bucket(-n, False).tolist()  # keys before the query: j − i = −n
    assert buckets[:16] == list(range(16))  # exact below max_exact = 16
    for d in (16, 17, 40, 100, 127, 128, 500, 2000):
        assert buckets[d] == min(31, 16 + math.floor(math.log(d / 16) / math.log(128 / 16) * 16))
    assert relative_position_bucket(torch.arange(1, 50), False).eq(0).all()  # future keys: bucket 0 (masked anyway)


def test_bidirectional_offsets_later_keys() -> None:
    assert relative_position_bucket(torch.tensor([0, -3, 3]), True).tolist() == [0, 3, 16 + 3]


def make(n_head: int = 3, n_layer: int = 2) -> T5Bias:
    torch.manual_seed(0)
    return T5Bias(T5Config(), ModelConfig(d_model=12 * n_head, n_head=n_head, n_layer=n_layer), 16)


def test_bias_reads_the_table_by_bucket_and_head() -> None:
    scheme = make()
    table = scheme.relative_attention_bias.weight
    T = 200
    ctx = PositionContext(positions=torch.arange(T))
    scheme.prepare(ctx)
    q = torch.zeros(1, 3, T, 12)
    bias = scheme.bias(0, q, q, ctx.positions, ctx.positions, ctx)
    assert bias is not None and bias.shape == (1, 3, T, T) and bias.dtype == torch.float32
    for i, j in [(0, 0), (5, 0), (17, 1), (199, 0), (150, 149), (3, 9)]:
        b = min(31, 16 + math.floor(math.log((i - j) / 16) / math.log(8) * 16)) if i - j >= 16 else max(i - j, 0)
        torch.testing.assert_close(bias[0, :, i, j], table[b].detach())


def test_one_table_shared_by_all_layers_and_relative() -> None:
    scheme = make(n_layer=4)
    assert list(scheme.state_dict()) == ["relative_attention_bias.weight"]
    assert scheme.relative_attention_bias.weight.shape == (32, 3)
    ctx = PositionContext(positions=torch.arange(310))  # the forward's positions cover every chunk asked for
    scheme.prepare(ctx)
    q = torch.zeros(1, 3, 40, 12)
    pos = torch.arange(40)
    biases = [scheme.bias(layer, q, q, pos, pos, ctx) for layer in range(4)]
    for b in biases[1:]:
        assert torch.equal(b, biases[0])
    # only i − j matters: queries 300..309 over keys 290..309 equal queries 10..19 over keys 0..19
    a = scheme.bias(0, q, q, torch.arange(300, 310), torch.arange(290, 310), ctx)
    b = scheme.bias(0, q, q, torch.arange(10, 20), torch.arange(0, 20), ctx)
    torch.testing.assert_close(a, b)


def test_initialisation_and_gradient() -> None:
    scheme = T5Bias(T5Config(), ModelConfig(d_model=256, n_head=8), 16)
    std = scheme.relative_attention_bias.weight.std().item()
    assert 0.5 * 256**-0.5 < std < 1.5 * 256**-0.5  # HF's N(0, d_model^-1/2)
    pos = torch.arange(30)
    ctx = PositionContext(pos)
    scheme.prepare(ctx)
    q = torch.zeros(1, 8, 30, 32)
    scheme.bias(0, q, q, pos, pos, ctx).sum().backward()
    grad = scheme.relative_attention_bias.weight.grad
    assert grad is not None and (grad[:16] != 0).all() and (grad[30:] == 0).all()  # far buckets unused at T = 30


def test_config_options_and_validation() -> None:
    cfg = config_from_dict({"pos": {"name": "t5", "num_buckets": 16, "max_distance": 64}})
    assert isinstance(cfg.pos, T5Config) and cfg.pos.num_buckets == 16
    with pytest.raises(ConfigError, match="max_distance"):
        config_from_dict({"pos": {"name": "t5", "num_buckets": 32, "max_distance": 16}})
    with pytest.raises(ConfigError, match="num_buckets"):
        config_from_dict({"pos": {"name": "t5", "num_buckets": 1}})
