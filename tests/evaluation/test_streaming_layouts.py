"""The streaming protocol on per-layer layouts: sliding windows inside the cache are honoured exactly, the floor-log
temperature is read at in-cache positions, and spans the cache cannot honour make the cell n/a with the reason."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_perplexity import BYTE_TOKEN_BYTES, V, byte_stream

from posenc_cli.config import ModelConfig
from posenc_cli.evaluation.perplexity.measuring import evaluate_model
from posenc_cli.evaluation.streaming import SpanBeyondCache, evaluate_streaming, unserved_span
from posenc_cli.model import GPT
from posenc_cli.positional import config_class
from posenc_cli.positional.layout import LayoutConfig

L = 16


def layout_model(layers: list[dict[str, Any]], n_layer: int, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    mcfg = ModelConfig(d_model=32, n_layer=n_layer, n_head=2, init_std=0.2)
    return GPT(mcfg, LayoutConfig(layers=layers), V, L).eval()


def preset(name: str, n_layer: int) -> GPT:
    torch.manual_seed(0)
    mcfg = ModelConfig(d_model=32, n_layer=n_layer, n_head=2, init_std=0.2)
    return GPT(mcfg, config_class(name)(name=name), V, L).eval()


def test_sliding_layers_inside_the_cache_stream_exactly_as_the_full_forward() -> None:
    """Every layer slides with W' = 3 <= W = 6: the cache keeps each layer's whole window, so the streaming decode
    (many evictions, sinks outside every window) scores each token as one forward over the stream does."""
    model = layout_model([{"name": "rope", "span": "sliding", "window": 3}], n_layer=2)
    tokens = byte_stream(200)
    stream = evaluate_streaming(model, tokens, BYTE_TOKEN_BYTES, length=40, window=6, sinks=2, n_tokens=80)
    plain = evaluate_model(model, tokens, BYTE_TOKEN_BYTES, length=40, protocol="nonoverlap", n_tokens=80)
    assert stream["windows"] == plain["windows"] == 2
    np.testing.assert_allclose(stream["per_position"], plain["per_position"], rtol=1e-5, atol=1e-5)


def test_full_layers_still_lose_what_the_cache_evicts() -> None:
    """The same model with full layers: streaming differs from the full forward (the check above can fail)."""
    model = layout_model([{"name": "rope"}], n_layer=2)
    tokens = byte_stream(200)
    stream = evaluate_streaming(model, tokens, BYTE_TOKEN_BYTES, length=40, window=6, sinks=2, n_tokens=80)
    plain = evaluate_model(model, tokens, BYTE_TOKEN_BYTES, length=40, protocol="nonoverlap", n_tokens=80)
    assert not np.allclose(stream["per_position"][8:], plain["per_position"][8:], rtol=1e-3)


def test_temperature_is_read_at_the_in_cache_position() -> None:
    """One NoPE layer with the floor-log temperature (F = 2): past the warm-up each token's NLL is that of one
    forward over the kept tokens (sinks + recent + itself), whose last index is its in-cache position."""
    model = layout_model([{"name": "nope", "temperature": 0.5, "floor_scale": 2}], n_layer=1)
    tokens = byte_stream(100)
    length, window, sinks = 30, 5, 2
    out = evaluate_streaming(model, tokens, BYTE_TOKEN_BYTES, length=length, window=window, sinks=sinks, n_tokens=30)
    expected = []
    with torch.no_grad():
        for t in range(sinks + window, length):
            kept = [*range(sinks), *range(t - window + 1, t + 1)]  # N sinks, the W - 1 most recent and t
            logits = model(torch.tensor(tokens[kept], dtype=torch.long)[None])[0, -1]
            expected.append(F.cross_entropy(logits, torch.tensor(int(tokens[t + 1]))).item())
    np.testing.assert_allclose(out["per_position"][sinks + window :], expected, rtol=1e-5, atol=1e-6)
    plain = evaluate_model(model, tokens, BYTE_TOKEN_BYTES, length=length, protocol="nonoverlap", n_tokens=30)
    np.testing.assert_allclose(out["per_position"][: sinks + window], plain["per_position"][: sinks + window],
                               rtol=1e-5, atol=1e-6)  # fmt: skip


@pytest.mark.parametrize(
    ("layers", "n_layer", "reason"),
    [
        ([{"name": "rope", "span": "chunked", "window": 4}], 1, "layer 0's chunked 4 span: its chunks would follow"),
        ([{"name": "nope"}, {"name": "rope", "span": "sliding", "window": 9}], 2, "layer 1's sliding 9 span: wider"),
    ],
)
def test_spans_the_cache_cannot_honour_are_refused_with_the_reason(
    layers: list[dict[str, Any]], n_layer: int, reason: str
) -> None:
    model = layout_model(layers, n_layer)
    tokens = byte_stream(200)
    with pytest.raises(SpanBeyondCache, match=reason) as err:
        evaluate_streaming(model, tokens, BYTE_TOKEN_BYTES, length=40, window=6, sinks=2, n_tokens=40)
    assert err.value.reason.startswith(reason) and "\n" not in str(err.value)
    fits = evaluate_streaming(model, tokens, BYTE_TOKEN_BYTES, length=8, window=6, sinks=2, n_tokens=40)
    assert np.isfinite(fits["nll"])  # nothing evicted: one causal forward, every span as in training
    wide = layout_model([{**entry, "window": 64} if "span" in entry else entry for entry in layers], n_layer)
    assert unserved_span(wide, 40, window=6, sinks=2) is None  # a span of 64 hides nothing in 40 tokens


def test_presets_irope_refused_past_the_warm_up_the_others_stream() -> None:
    tokens = byte_stream(300)
    assert "chunked 4" in str(unserved_span(preset("irope", 4), 40, window=12, sinks=4))
    for name, n_layer in (("rnope-swa", 4), ("smollm3", 4), ("gemma3", 6)):
        model = preset(name, n_layer)
        assert unserved_span(model, 40, window=12, sinks=4) is None
        out = evaluate_streaming(model, tokens, BYTE_TOKEN_BYTES, length=32, window=12, sinks=4, n_tokens=64)
        assert np.isfinite(out["nll"]) and out["windows"] == 2
    assert unserved_span(preset("rnope-swa", 4), 40, window=3, sinks=4) is not None  # W' = 4 > W = 3
