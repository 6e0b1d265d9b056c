"""Learned absolute positions: a trained table of train_length rows; longer inputs raise LengthBeyondScheme."""

from __future__ import annotations

import pytest
import torch

from posenc_cli.config import ModelConfig
from posenc_cli.errors import LengthBeyondScheme, UserError
from posenc_cli.model import GPT
from posenc_cli.positional.learned import LearnedConfig


def make(train_length: int = 16) -> GPT:
    return GPT(ModelConfig(d_model=32, n_layer=1, n_head=2), LearnedConfig(), 40, train_length)


def test_table_shape_init_and_checkpointed() -> None:
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=256, n_layer=1, n_head=4), LearnedConfig(), 40, 512)
    w = model.scheme.wpe.weight
    assert w.shape == (512, 256) and w.requires_grad
    assert abs(w.std().item() - 0.02) < 0.001
    assert "scheme.wpe.weight" in model.state_dict()


def test_embed_adds_table_rows() -> None:
    model = make()
    idx = torch.randint(0, 40, (3, 12))
    ctx = model.context(idx)
    torch.testing.assert_close(model.embed(idx, ctx), model.wte(idx) + model.scheme.wpe.weight[:12])


def test_length_limit() -> None:
    model = make(16)
    assert model(torch.randint(0, 40, (1, 16))).shape == (1, 16, 40)
    with pytest.raises(LengthBeyondScheme) as err:
        model(torch.randint(0, 40, (1, 17)))
    assert isinstance(err.value, UserError)
    assert (err.value.limit, err.value.requested) == (16, 17)
    assert "16" in str(err.value) and "17" in str(err.value)


def test_table_receives_gradients() -> None:
    model = make()
    model(torch.randint(0, 40, (2, 10))).sum().backward()
    grad = model.scheme.wpe.weight.grad
    assert grad is not None and grad[:10].abs().sum() > 0 and grad[10:].abs().sum() == 0
