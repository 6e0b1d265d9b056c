"""The Scored road (schemes that own the logits or the normaliser): equal to the other roads for the default
logits and softmax, chosen for such schemes only, and exact under KV-cache decoding and a layer's span."""

from __future__ import annotations

import pytest
import torch
from attention_utils import force_chunks

from posenc_cli.attention import KernelSpec, choose_kernel
from posenc_cli.attention.scored import Scored
from posenc_cli.config import ModelConfig
from posenc_cli.model import GPT
from posenc_cli.positional.alibi import ALiBi, AlibiConfig
from posenc_cli.positional.layout import LayoutConfig

CFG = ModelConfig(d_model=16, n_layer=2, n_head=2, dropout=0.0)


class ScoredALiBi(ALiBi):
    """ALiBi with the logits hook doing what the kernel would: q·kᵀ/√d + bias (a test double)."""

    hooks = ("bias", "logits")

    def logits(self, layer, q, k, q_pos, k_pos, ctx):
        return (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5 + self.bias(layer, q, k, q_pos, k_pos, ctx)


class SoftmaxALiBi(ALiBi):
    """ALiBi that owns the (default) normaliser: the softmax, computed by the Scored road."""

    hooks = ("bias", "normalise")


@pytest.mark.parametrize("double", [ScoredALiBi, SoftmaxALiBi])
def test_default_logits_and_softmax_equal_the_bias_road(double: type) -> None:
    torch.manual_seed(0)
    plain = GPT(CFG, AlibiConfig(), 11, 8).eval()
    owned = GPT(CFG, AlibiConfig(), 11, 8).eval()
    owned.load_state_dict(plain.state_dict())
    owned.scheme = double(AlibiConfig(), CFG, 8)
    idx = torch.randint(0, 11, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(owned(idx), plain(idx), atol=1e-5, rtol=1e-5)
        force_chunks(owned, 3)  # Scored reads no forced chunk; the result must not depend on it
        cache = owned.new_cache()
        parts = [owned(idx[:, :6], cache=cache), owned(idx[:, 6:], cache=cache)]
        torch.testing.assert_close(torch.cat(parts, dim=1), plain(idx), atol=1e-5, rtol=1e-5)


def test_chosen_for_schemes_that_own_scores_only() -> None:
    spec = KernelSpec(has_bias=False, dtype=torch.float32, device="cpu", seq_len=64, owns_scores=True)
    assert isinstance(choose_kernel(spec), Scored)
    assert not isinstance(
        choose_kernel(KernelSpec(has_bias=False, dtype=torch.float32, device="cpu", seq_len=64)), Scored
    )
    rows = choose_kernel(
        KernelSpec(has_bias=False, dtype=torch.float32, device="cpu", seq_len=64, owns_scores=True, q_start=63)
    )
    assert isinstance(rows, Scored) and rows.q_start == 63


@pytest.mark.parametrize("name", ["stickbreaking", "fox"])
@pytest.mark.parametrize("span", ["sliding", "chunked"])
def test_span_layers_decode_exactly(name: str, span: str) -> None:
    torch.manual_seed(1)
    layers = [{"name": name, "span": span, "window": 3}, {"name": name}]
    model = GPT(CFG, LayoutConfig(layers=layers), 11, 8).eval()
    idx = torch.randint(0, 11, (2, 11))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache()
        parts = [model(idx[:, :5], cache=cache), model(idx[:, 5:6], cache=cache), model(idx[:, 6:], cache=cache)]
        torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)
        wide = GPT(CFG, LayoutConfig(layers=[{"name": name}]), 11, 8).eval()
        wide.load_state_dict(model.state_dict())
        assert not torch.allclose(wide(idx)[:, 4:], full[:, 4:], atol=1e-4)  # the span hides keys: it matters
