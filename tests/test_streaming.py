"""The streaming protocol (StreamingLLM's attention sinks): the batched blocks against a direct token-by-token
reading, and the protocols it coincides with (nonoverlap when nothing is evicted, sliding with stride 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc_cli.errors import LengthBeyondScheme
from posenc_cli.evaluation import perplexity as ev
from posenc_cli.evaluation.streaming import block_rows, evaluate_streaming, streaming_reference
from tests.test_evaluate import BYTE_TOKEN_BYTES, byte_stream, tiny_model


@pytest.mark.parametrize("scheme", ["rope", "alibi", "sinusoidal", "learned", "nope", "t5"])
@pytest.mark.parametrize(("window", "sinks", "block"), [(5, 2, 1), (5, 2, 3), (4, 0, 1), (3, 4, 2)])
def test_blocks_equal_a_token_by_token_reference(scheme: str, window: int, sinks: int, block: int) -> None:
    model = tiny_model(scheme, seed=1)
    tokens = byte_stream(200)
    L = 24
    got = evaluate_streaming(
        model,
        tokens,
        BYTE_TOKEN_BYTES,
        length=L,
        window=window,
        sinks=sinks,
        block=block,
        n_tokens=3 * L,
        batch_tokens=40,
    )
    ref = torch.stack(
        [
            streaming_reference(model, tokens[s : s + L + 1], window=window, sinks=sinks, block=block)
            for s in (0, L, 2 * L)
        ]
    )  # (3, L)
    assert got["tokens"] == 3 * L and got["windows"] == 3 and got["stride"] == block
    np.testing.assert_allclose(got["per_position"], ref.mean(0).numpy(), rtol=1e-5, atol=1e-6)
    assert got["nll"] == pytest.approx(float(ref.mean()), rel=1e-6)
    assert got["bytes"] == 3 * L  # byte tokens, no end-of-document in this text


def test_no_eviction_and_no_sinks_is_the_nonoverlap_protocol() -> None:
    model = tiny_model("rope", seed=2)
    tokens = byte_stream(300)
    for length in (16, 40):
        plain = ev.evaluate_model(model, tokens, BYTE_TOKEN_BYTES, length=length, n_tokens=120)
        got = evaluate_streaming(model, tokens, BYTE_TOKEN_BYTES, length=length, window=length, sinks=0, n_tokens=120)
        assert got["tokens"] == plain["tokens"] and got["bytes"] == plain["bytes"]
        assert got["nll"] == pytest.approx(plain["nll"], rel=1e-6)
        np.testing.assert_allclose(got["per_position"], plain["per_position"], rtol=1e-5, atol=1e-6)


def test_no_sinks_block_1_is_the_sliding_protocol_with_stride_1() -> None:
    model = tiny_model("sinusoidal", seed=3)
    tokens = byte_stream(200)
    L, W = 48, 8
    got = evaluate_streaming(model, tokens, BYTE_TOKEN_BYTES, length=L, window=W, sinks=0, n_tokens=L)
    sliding = ev.evaluate_model(
        model, tokens, BYTE_TOKEN_BYTES, length=W, protocol="sliding", stride=1, n_tokens=L - W + 1
    )
    assert sliding["tokens"] == L - W + 1
    assert float(np.mean(got["per_position"][W - 1 :])) == pytest.approx(sliding["nll"], rel=1e-6)


def test_block_plan_and_scheme_limit() -> None:
    assert block_rows(10, 4, 2, 3) == [(6, 3), (9, 1)]
    assert block_rows(6, 4, 2, 3) == []
    model = tiny_model("learned")  # a table of 16 positions
    tokens = byte_stream(200)
    evaluate_streaming(model, tokens, None, length=64, window=12, sinks=4, n_tokens=64)  # cache 16: fits
    with pytest.raises(LengthBeyondScheme):
        evaluate_streaming(model, tokens, None, length=64, window=12, sinks=4, block=2, n_tokens=64)
