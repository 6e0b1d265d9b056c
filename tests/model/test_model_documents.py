"""`GPT.forward(documents=)` at the model's boundary: what it refuses, and its default position ids."""

from __future__ import annotations

import pytest
import torch

from posenc_cli.config import ModelConfig
from posenc_cli.model import GPT
from posenc_cli.positional import config_class

TINY = ModelConfig(d_model=32, n_layer=2, n_head=2)


def model(name: str = "learned") -> GPT:
    torch.manual_seed(0)
    return GPT(TINY, config_class(name)(), 32, 16).eval()


def test_a_cached_row_ending_in_a_pad_needs_the_new_tokens_documents() -> None:
    """With a KV cache, new tokens without documents continue their row's last document; a pad is a document of its
    own, so a row that ends in one cannot be continued (left pads, `kv_cache`, are the padding a cache takes)."""
    m = model()
    idx = torch.randint(0, 32, (1, 6))
    cache = m.new_cache()
    with pytest.raises(ValueError, match="ends in a pad"), torch.no_grad():
        m(idx, documents=torch.tensor([[0, 0, 0, 0, 0, -1]]), cache=cache)
        m(idx[:, :1], cache=cache)


@pytest.mark.parametrize(
    ("documents", "message"),
    [
        (torch.zeros(6, dtype=torch.long), r"documents of shape \(6,\) do not fit tokens of shape \(1, 6\)"),
        (torch.zeros(1, 6), "documents must be integers"),
    ],
)
def test_documents_that_do_not_fit_are_refused(documents: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        model()(torch.randint(0, 32, (1, 6)), documents=documents)


def test_without_position_ids_each_document_counts_from_zero() -> None:
    """Documents alone: the ids restart at each document's first token (a learned table reads them, so the second
    document's logits are its own logits from position 0)."""
    m = model()
    idx = torch.randint(0, 32, (1, 12), generator=torch.Generator().manual_seed(0))
    documents = torch.tensor([[0] * 5 + [1] * 7])
    with torch.no_grad():
        out = m(idx, documents=documents)
        torch.testing.assert_close(out[0, 5:], m(idx[:, 5:])[0], rtol=1e-5, atol=1e-5)
        assert (out[0, 5:] - m(idx)[0, 5:]).abs().max() > 1e-3  # not the row's own positions
