"""The streaming protocol (StreamingLLM's attention sinks) against a direct re-implementation of the reference decode
(mit-han-lab/streaming-llm: one token per forward, `StartRecentKVCache`, keys stored unrotated and rotated at their
in-cache positions) written here from the model's weights, on 2-layer models with many evictions; and the protocols
it coincides with (nonoverlap when nothing is evicted; with one layer, re-computation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_perplexity import BYTE_TOKEN_BYTES, byte_stream, tiny_model

from posenc_cli.errors import ConfigError, LengthBeyondScheme
from posenc_cli.evaluation.perplexity.measuring import evaluate_model
from posenc_cli.evaluation.streaming import block_rows, evaluate_streaming
from posenc_cli.model import GPT


def _rotate(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """RoPE, rotate_half layout (HF Llama), written out: x (H, T, d) at integer positions (T,)."""
    d = x.shape[-1]
    inv = base ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angles = positions.double()[:, None] * inv[None, :]  # (T, d/2)
    cos, sin = torch.cat([angles.cos()] * 2, -1).float(), torch.cat([angles.sin()] * 2, -1).float()  # (T, d)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _alibi_slopes(n_head: int) -> torch.Tensor:
    """Press et al. 2022: 2^(−8h/H), h = 1..H, for H a power of two."""
    return torch.tensor([2 ** (-8 * (h + 1) / n_head) for h in range(n_head)])


def reference_decode(model: GPT, stream: np.ndarray, *, sinks: int, recent: int) -> torch.Tensor:
    """NLL (len − 1,) of each target of `stream` read one token per step, as StreamingLLM's eval_long_ppl.py does:
    per layer a list of unrotated keys and values; after each step the cache is cut to [0:sinks] + [len−recent:];
    RoPE keys rotated at their in-cache positions 0..kv_len−1, the query at kv_len−1; ALiBi's bias −m·(i − j) by
    in-cache positions. Built from the model's modules, not its forward."""
    name = model.scheme.name
    H, hd = model.config.n_head, model.config.head_dim
    keys: list[list[torch.Tensor]] = [[] for _ in model.blocks]  # per layer, (H, hd) per cached token
    values: list[list[torch.Tensor]] = [[] for _ in model.blocks]
    losses = []
    with torch.no_grad():
        for t in range(len(stream) - 1):
            x = model.wte(torch.tensor([int(stream[t])]))  # (1, D)
            for layer, block in enumerate(model.blocks):
                q, k, v = block.attn.qkv(block.norm1(x)).split(model.config.d_model, dim=-1)  # 3 × (1, D)
                keys[layer].append(k.view(H, hd))
                values[layer].append(v.view(H, hd))
                K = torch.stack(keys[layer], dim=1)  # (H, n, hd)
                V = torch.stack(values[layer], dim=1)  # (H, n, hd)
                n = K.shape[1]
                q = q.view(H, 1, hd)
                bias = torch.zeros(H, 1, n)
                if name == "rope":
                    K = _rotate(K, torch.arange(n), model.scheme.cfg.base)
                    q = _rotate(q, torch.tensor([n - 1]), model.scheme.cfg.base)
                elif name == "alibi":
                    bias = -_alibi_slopes(H)[:, None, None] * (n - 1 - torch.arange(n))[None, None, :]
                probs = torch.softmax(q @ K.transpose(-1, -2) / math.sqrt(hd) + bias, dim=-1)  # (H, 1, n)
                y = (probs @ V).transpose(0, 1).reshape(1, -1)  # (1, D)
                x = x + block.attn.proj(y)
                x = x + block.mlp(block.norm2(x))
            logits = model.lm_head(model.norm_f(x))[0]  # (V,)
            losses.append(F.cross_entropy(logits[None], torch.tensor([int(stream[t + 1])])).double())
            for layer in range(len(keys)):  # StartRecentKVCache: [0:start] + [len-recent:]
                if len(keys[layer]) > sinks + recent:
                    cut = len(keys[layer]) - recent
                    keys[layer] = keys[layer][:sinks] + keys[layer][cut:]
                    values[layer] = values[layer][:sinks] + values[layer][cut:]
    return torch.stack(losses)


def recomputed(model: GPT, stream: np.ndarray, *, sinks: int, window: int) -> torch.Tensor:
    """posenc's former protocol: each token read by a fresh forward over the sinks and its window (re-computation)."""
    first = sinks + window
    out = []
    with torch.no_grad():
        for t in range(len(stream) - 1):
            keep = list(range(t + 1)) if t < first else [*range(sinks), *range(t - window + 1, t + 1)]
            logits = model(torch.as_tensor(stream[keep], dtype=torch.long)[None])[0, -1]
            out.append(F.cross_entropy(logits[None], torch.tensor([int(stream[t + 1])])).double())
    return torch.stack(out)


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
@pytest.mark.parametrize(("window", "sinks"), [(5, 2), (4, 0), (3, 4)])
def test_streaming_equals_the_reference_decode_on_two_layers(scheme: str, window: int, sinks: int) -> None:
    model = tiny_model(scheme, seed=1)
    assert len(model.blocks) == 2
    tokens = byte_stream(200)
    L = 24  # L − (sinks + window) >= 15 evictions per stream
    got = evaluate_streaming(
        model, tokens, BYTE_TOKEN_BYTES, length=L, window=window, sinks=sinks, n_tokens=3 * L, batch_tokens=20
    )
    ref = torch.stack(
        [reference_decode(model, tokens[s : s + L + 1], sinks=sinks, recent=window - 1) for s in (0, L, 2 * L)]
    )  # (3, L)
    assert got["tokens"] == 3 * L and got["windows"] == 3 and got["stride"] == 1
    np.testing.assert_allclose(got["per_position"], ref.mean(0).numpy(), rtol=0, atol=1e-5)
    assert got["nll"] == pytest.approx(float(ref.mean()), abs=1e-6)
    assert got["bytes"] == 3 * L  # byte tokens, no end-of-document in this text


def test_the_reference_decode_differs_from_recomputation_with_two_layers() -> None:
    """What the protocol used to compute (a fresh forward over the kept tokens) is not StreamingLLM's: from layer
    2 on a cached K/V carries tokens evicted since."""
    model = tiny_model("rope", seed=1)
    stream = byte_stream(200)[:25]
    ref = reference_decode(model, stream, sinks=2, recent=4)
    old = recomputed(model, stream, sinks=2, window=5)
    torch.testing.assert_close(ref[:7], old[:7], atol=1e-5, rtol=0)  # the warm-up: nothing evicted yet
    assert (ref[7:] - old[7:]).abs().max() > 1e-3


@pytest.mark.parametrize("block", [2, 3])
def test_blocks_read_several_tokens_per_forward_against_the_trimmed_cache(block: int) -> None:
    """S > 1: token t0 + b sees the sinks and its W + b most recent tokens; with one layer that equals a fresh
    forward over exactly those tokens (RoPE: positions re-assigned in the cache)."""
    model = tiny_model("rope", seed=2)
    model.blocks = model.blocks[:1]
    tokens = byte_stream(100)
    L, W, N = 20, 4, 2
    got = evaluate_streaming(model, tokens, BYTE_TOKEN_BYTES, length=L, window=W, sinks=N, block=block, n_tokens=L)
    expected = []
    with torch.no_grad():
        for t in range(L):
            t0 = N + W + (t - N - W) // block * block
            keep = list(range(t + 1)) if t < N + W else [*range(N), *range(t0 - W + 1, t + 1)]
            logits = model(torch.as_tensor(tokens[keep], dtype=torch.long)[None])[0, -1]
            expected.append(float(F.cross_entropy(logits[None], torch.tensor([int(tokens[t + 1])]))))
    np.testing.assert_allclose(got["per_position"], expected, rtol=0, atol=1e-5)
    assert got["stride"] == block


def test_no_eviction_and_no_sinks_is_the_nonoverlap_protocol() -> None:
    model = tiny_model("rope", seed=2)
    tokens = byte_stream(300)
    for length in (16, 40):
        plain = evaluate_model(model, tokens, BYTE_TOKEN_BYTES, length=length, n_tokens=120)
        got = evaluate_streaming(model, tokens, BYTE_TOKEN_BYTES, length=length, window=length, sinks=0, n_tokens=120)
        assert got["tokens"] == plain["tokens"] and got["bytes"] == plain["bytes"]
        assert got["nll"] == pytest.approx(plain["nll"], rel=1e-6)
        np.testing.assert_allclose(got["per_position"], plain["per_position"], rtol=1e-5, atol=1e-6)


def test_one_layer_no_sinks_is_the_sliding_protocol_with_stride_1() -> None:
    model = tiny_model("rope", seed=3)
    model.blocks = model.blocks[:1]  # one layer: a cached K/V is what re-computation gives (unrotated keys)
    tokens = byte_stream(200)
    L, W = 48, 8
    got = evaluate_streaming(model, tokens, BYTE_TOKEN_BYTES, length=L, window=W, sinks=0, n_tokens=L)
    sliding = evaluate_model(
        model, tokens, BYTE_TOKEN_BYTES, length=W, protocol="sliding", stride=1, n_tokens=L - W + 1
    )
    assert sliding["tokens"] == L - W + 1
    assert float(np.mean(got["per_position"][W - 1 :])) == pytest.approx(sliding["nll"], rel=1e-5)


def test_block_plan_scheme_limit_and_models_without_a_cache() -> None:
    assert block_rows(10, 4, 2, 3) == [(6, 3), (9, 1)]
    assert block_rows(6, 4, 2, 3) == []
    model = tiny_model("learned")  # a table of 16 positions
    tokens = byte_stream(200)
    evaluate_streaming(model, tokens, None, length=64, window=12, sinks=4, n_tokens=64)  # cache 16: fits
    with pytest.raises(LengthBeyondScheme):
        evaluate_streaming(model, tokens, None, length=64, window=12, sinks=4, block=2, n_tokens=64)

    class NoCache(torch.nn.Module):
        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return torch.zeros(*idx.shape, 257)

    with pytest.raises(ConfigError, match="KV cache"):
        evaluate_streaming(NoCache(), tokens, None, length=32, window=8, sinks=2, n_tokens=32)


def test_cells_read_before_the_kv_cache_are_not_reused() -> None:
    """A streaming cell stored without `decode` was measured by re-encoding the kept tokens: another key, so it is
    measured again rather than reused, and it never shares a table row with a KV-cache cell."""
    from posenc_cli.evaluation.results import cell_group, entry_key
    from posenc_cli.evaluation.streaming import STREAMING_DECODE

    new = {
        "protocol": "streaming", "stride": 1, "window": 6, "sinks": 2, "decode": STREAMING_DECODE, "length": 48,
        "tokens": 96, "dtype": "fp32", "data": {"name": "text", "fingerprint": "f"},
        "checkpoint": {"step": 10, "sha256": "abc"},
    }  # fmt: skip
    old = {k: v for k, v in new.items() if k != "decode"}
    assert entry_key(new) != entry_key(old) and cell_group(new) != cell_group(old)
    assert entry_key(new) == entry_key(dict(new))
