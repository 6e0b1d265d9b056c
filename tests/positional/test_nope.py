"""NoPE: without the causal mask the model is permutation-equivariant; with it, order still matters."""

from __future__ import annotations

import torch

from posenc_cli.config import ModelConfig
from posenc_cli.model import GPT
from posenc_cli.positional.nope import NopeConfig


def make() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(d_model=32, n_layer=2, n_head=2), NopeConfig(), 50, 16).eval()


def test_unmasked_model_is_permutation_equivariant() -> None:
    model = make()
    idx = torch.randint(0, 50, (2, 20))
    perm = torch.randperm(20)
    out = model(idx, causal=False)
    out_perm = model(idx[:, perm], causal=False)
    torch.testing.assert_close(out_perm, out[:, perm], rtol=1e-4, atol=1e-5)


def test_causal_mask_makes_order_matter() -> None:
    model = make()
    idx = torch.arange(1, 21)[None]  # distinct tokens
    perm = torch.cat([torch.randperm(19, generator=torch.Generator().manual_seed(0)), torch.tensor([19])])
    assert not torch.equal(perm, torch.arange(20))
    # The last token sees the same multiset of tokens in both orders:
    last = model(idx)[:, -1]
    last_perm = model(idx[:, perm])[:, -1]
    unmasked = model(idx, causal=False)[:, -1], model(idx[:, perm], causal=False)[:, -1]
    torch.testing.assert_close(unmasked[0], unmasked[1], rtol=1e-4, atol=1e-5)  # without the mask: identical
    assert (last - last_perm).abs().max() > 1e-3  # with the mask: earlier tokens saw different prefixes


def test_no_parameters_or_hooks() -> None:
    model = make()
    assert model.scheme.hooks == () and not list(model.scheme.parameters())
