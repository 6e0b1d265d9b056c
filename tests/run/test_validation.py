"""validation: the fixed validation windows and the mean next-token loss over them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from posenc_cli.errors import DataError
from posenc_cli.run.validation import evaluate_loss, validation_batches


def test_validation_batches_are_fixed_and_shifted() -> None:
    val = (torch.arange(1000) % 251).numpy()
    w = validation_batches(val, batch_size=3, seq_len=8, n_batches=2)
    assert w.shape == (2, 3, 9)
    assert torch.equal(w, validation_batches(val, batch_size=3, seq_len=8, n_batches=2))
    flat = w.reshape(6, 9)
    assert flat[0, 0] == 0 and flat[-1, -1] == val[-1]  # evenly spread over the whole split
    assert torch.equal(flat[:, 1:] - flat[:, :-1], torch.ones(6, 8, dtype=torch.int64))  # contiguous windows


def test_validation_batches_need_one_window_of_tokens() -> None:
    with pytest.raises(DataError, match="needs at least 9"):
        validation_batches(np.arange(8), batch_size=1, seq_len=8, n_batches=1)


@pytest.mark.parametrize("training", [True, False])
def test_evaluate_loss_is_the_mean_cross_entropy_and_keeps_the_mode(training: bool) -> None:
    V = 7
    torch.manual_seed(0)
    model = nn.Embedding(V, V)  # logits of the next token = a table row per current token: (B, T) -> (B, T, V)
    model.train(training)
    windows = torch.randint(0, V, (3, 2, 6))  # (n, B, T+1)
    got = evaluate_loss(model, windows, torch.device("cpu"), "fp32")
    # reference in float64 numpy: -log softmax(logits)[target], averaged over every position of every window
    table = model.weight.detach().double().numpy()
    x, y = windows[..., :-1].numpy(), windows[..., 1:].numpy()
    logits = table[x]  # (n, B, T, V)
    log_z = np.log(np.exp(logits).sum(-1))
    expected = float(np.mean(log_z - np.take_along_axis(logits, y[..., None], -1)[..., 0]))
    assert got == pytest.approx(expected, rel=1e-6)
    assert model.training is training
