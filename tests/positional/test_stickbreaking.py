"""Stick-breaking attention: weights equal the paper's product (float64 loop), sum to one with the remainder on the
query, run through the model's Scored road, with a KV cache and a span."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.config import ModelConfig
from posenc_cli.errors import ConfigError
from posenc_cli.model import GPT
from posenc_cli.positional.span import Span
from posenc_cli.positional.stickbreaking import StickBreakingConfig, stick_breaking_weights


def naive_weights(z: torch.Tensor, attend_current: bool) -> torch.Tensor:
    """float64 (T, T) logits -> weights, pair by pair: A_ij = β_ij Π_{j<k<i} (1 − β_ik) (k ≤ i with attend_current),
    and the remainder 1 − Σ_j A_ij added on the query's own key (Tan et al. 2025; the reference's ref_fwd)."""
    z = z.double()
    T = z.shape[0]
    out = torch.zeros(T, T, dtype=torch.float64)
    sig = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    for i in range(T):
        last = i if attend_current else i - 1
        for j in range(last + 1):
            a = sig(z[i, j].item())
            for k in range(j + 1, last + 1):
                a *= 1 - sig(z[i, k].item())
            out[i, j] = a
        out[i, i] += 1 - out[i].sum()
    return out


def test_weights_equal_the_float64_product_for_both_settings() -> None:
    z = torch.randn(6, 6, generator=torch.Generator().manual_seed(0)) * 2
    pos = torch.arange(6)
    causal = pos[None, :] <= pos[:, None]
    for attend_current in (False, True):
        got = stick_breaking_weights(z[None, None], pos, pos, causal, attend_current)[0, 0]
        torch.testing.assert_close(got.double(), naive_weights(z, attend_current), atol=1e-6, rtol=0)
        torch.testing.assert_close(got.sum(-1), torch.ones(6))  # the remainder makes each row a distribution
        assert bool((got[~causal] == 0).all())


def test_a_hidden_key_neither_takes_nor_breaks() -> None:
    z = torch.randn(5, 5, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(5)
    visible = Span("sliding", 2).visible(pos, pos) & (pos[None, :] <= pos[:, None])
    got = stick_breaking_weights(z[None, None], pos, pos, visible)[0, 0]
    # with a window of 2 each query breaks only its previous key: A_{i,i−1} = β, the rest on itself
    for i in range(1, 5):
        beta = torch.sigmoid(z[i, i - 1])
        torch.testing.assert_close(got[i, i - 1], beta)
        torch.testing.assert_close(got[i, i], 1 - beta)
    assert bool((got[~visible] == 0).all())


def model_and_tokens(seed: int = 0, logit_bias: float = 0.0) -> tuple[GPT, torch.Tensor]:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=16, n_layer=2, n_head=2, dropout=0.0)
    scheme = StickBreakingConfig(logit_bias=logit_bias)
    return GPT(cfg, scheme, vocab_size=11, train_length=8).eval(), torch.randint(0, 11, (2, 9))


@pytest.mark.parametrize("logit_bias", [0.0, -3.0])
def test_model_output_equals_the_float64_reference_of_one_layer(logit_bias: float) -> None:
    """pos.logit_bias b breaks the stick by σ(z + b): the reference's product of the shifted logits."""
    model, idx = model_and_tokens(logit_bias=logit_bias)
    attn = model.blocks[0].attn
    x = model.blocks[0].norm1(model.wte(idx))  # (B, T, D)
    with torch.no_grad():
        q, k, v = attn.qkv_heads(x, model.scheme, model.context(idx))
        y = attn(x, model.scheme, model.context(idx))
        B, H, T, d = q.shape
        z = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d) + logit_bias
        ref = torch.stack([torch.stack([naive_weights(z[b, h], False) for h in range(H)]) for b in range(B)])
        heads = (ref @ v.double()).transpose(1, 2).reshape(B, T, H * d)
        expected = attn.proj(heads.float())
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)


def test_kv_cache_decoding_equals_the_full_forward() -> None:
    model, idx = model_and_tokens(2)
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache()
        parts = [model(idx[:, :5], cache=cache), model(idx[:, 5:6], cache=cache), model(idx[:, 6:], cache=cache)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)


def test_gradients_flow_to_queries_and_keys() -> None:
    model, idx = model_and_tokens(3)
    model.train()
    model(idx).logsumexp(-1).mean().backward()
    grad = model.blocks[0].attn.qkv.weight.grad
    assert grad is not None and bool(torch.isfinite(grad).all()) and grad.abs().sum() > 0


def test_a_logit_bias_must_be_finite() -> None:
    with pytest.raises(ConfigError, match="pos.logit_bias"):
        StickBreakingConfig(logit_bias=float("-inf")).validate()
