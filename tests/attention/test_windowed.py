"""Sliding-window and chunked attention against a dense reference with the corresponding T×T mask.

For every plain scheme (its bias hook included), every road a span takes (`Windowed` in one chunk and in many,
`BlockCausal`, the KV cache's rows, `Remapped`), lengths below, at and beyond the window W and chunk C, with and
without gradients: the outputs equal the reference to 1e-6 (fp32 kernels against an fp64 reference), the
gradients of q, k and v to 1e-6 + 1e-5 relative.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from scheme_utils import lively, plain_schemes

from posenc_cli.attention import AttentionState, attend, choose_kernel, describe, fold_causal_mask, merged_scores
from posenc_cli.attention.windowed import BlockCausal, Windowed
from posenc_cli.config import ModelConfig, RemapConfig
from posenc_cli.model import GPT
from posenc_cli.positional import config_class
from posenc_cli.positional.rope import RopeConfig
from posenc_cli.positional.span import FULL, Span

TINY = ModelConfig(d_model=32, n_layer=2, n_head=2)
W, C = 5, 4
SPANS = [Span("sliding", W), Span("chunked", C)]
LENGTHS = [3, 4, 5, 13]  # below both, at C, at W, beyond both


def dense_reference(q, k, v, scheme, ctx, span: Span, causal: bool = True) -> torch.Tensor:
    """softmax(q·kᵀ/√hd + bias + mask)·v in fp64 with the whole T×T mask: causal and the span's, from first
    principles (i − W < j for a window, ⌊i/C⌋ = ⌊j/C⌋ for chunks)."""
    T = q.shape[2]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (j <= i) if causal else torch.ones(T, T, dtype=torch.bool)
    if span.kind == "sliding":
        allowed = allowed & (j > i - span.size)
    elif span.kind == "chunked":
        allowed = allowed & (i // span.size == j // span.size)
    pos = ctx.token_index
    if "logits" in scheme.hooks:  # the scheme's own logits (defined where causal attention looks)
        scores = scheme.logits(0, q, k, pos, pos, ctx).double()
    else:
        bias = scheme.bias(0, q, k, pos, pos, ctx) if scheme.has_bias else None
        scores = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
        if bias is not None:
            scores = scores + bias.double()
    if "normalise" in scheme.hooks:  # the scheme's own weights over the allowed keys
        return scheme.normalise(0, scores.masked_fill(~allowed, 0.0), pos, pos, allowed, ctx) @ v.double()
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v.double()


def qkv(T: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, TINY.n_head, T, TINY.head_dim, generator=g).requires_grad_() for _ in range(3)]


def check(model: GPT, span: Span, T: int, chunk_size: int | None = None, ids: torch.Tensor | None = None) -> None:
    idx = torch.zeros(2, T, dtype=torch.long)
    ctx = model.context(idx, ids)
    scheme = model.scheme
    if "content" in scheme.hooks:  # what the attention layer stores before attending: features of an input
        x = torch.randn(2, T, TINY.d_model, generator=torch.Generator().manual_seed(1))
        ctx.content[0] = scheme.content(0, x, ctx)
    q, k, v = qkv(T)
    out = attend(q, k, v, scheme, 0, ctx, span=span, chunk_size=chunk_size)  # (B, H, T, hd)
    grad = torch.randn_like(out)
    got = torch.autograd.grad((out * grad).sum(), (q, k, v))
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = dense_reference(q64, k64, v64, scheme, ctx, span)
    want = torch.autograd.grad((ref * grad.double()).sum(), (q64, k64, v64))
    torch.testing.assert_close(out.double(), ref.detach(), atol=1e-6, rtol=0)
    for a, b in zip(got, want, strict=True):  # gradients: fp32 accumulation, relative to their size
        torch.testing.assert_close(a.double(), b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", plain_schemes())
@pytest.mark.parametrize("span", SPANS, ids=lambda s: s.kind)
def test_every_scheme_with_a_span_equals_the_dense_masked_reference(name: str, span: Span) -> None:
    torch.manual_seed(0)
    model = lively(GPT(TINY, config_class(name)(), 48, 16))
    for T in LENGTHS:
        check(model, span, T)  # one chunk of queries (or the block road)
        check(model, span, T, chunk_size=2)  # many chunks: each scores only the keys its queries can see


@pytest.mark.parametrize("span", SPANS, ids=lambda s: s.kind)
def test_spans_with_explicit_ids_follow_token_order(span: Span) -> None:
    """The span, like the causal mask, follows token order whatever the ids (relative schemes' bias from ids)."""
    for name in ("alibi", "t5", "rope"):
        torch.manual_seed(0)
        model = lively(GPT(TINY, config_class(name)(), 48, 16))
        check(model, span, 13, ids=torch.arange(13) * 2 + 1)
        check(model, span, 13, chunk_size=3, ids=torch.stack([torch.arange(13) * 2, torch.arange(13) + 3]))


@pytest.mark.parametrize("span", SPANS, ids=lambda s: s.kind)
def test_remapped_scores_take_the_span_mask(span: Span) -> None:
    """Self-Extend with a span: the remapped road equals softmax(merged scores + span and causal masks)·v built
    densely from `merged_scores` over all T×T pairs."""
    torch.manual_seed(0)
    pos = RopeConfig(remap=RemapConfig(method="self-extend", window=3, group=2))
    model = lively(GPT(TINY, pos, 48, 16))
    T = 13
    ctx = model.context(torch.zeros(1, T, dtype=torch.long))
    q, k, v = (x.detach() for x in qkv(T))
    q, k = model.scheme.rotate(q, k, ctx)
    assert describe(AttentionState(model.scheme, ctx), q, span=span).remap
    for chunk in (None, 3):
        out = attend(q, k, v, model.scheme, 0, ctx, span=span, chunk_size=chunk)
        q2, k2 = model.scheme.remap(q, k, ctx)
        scores = merged_scores(q, k, q2, k2, model.scheme.remap_window, ctx, 0, T, T).double()  # (B, H, T, T)
        pos_ = ctx.token_index
        mask = fold_causal_mask(None, pos_, pos_, torch.float64, True, span)
        ref = torch.softmax(scores + mask, dim=-1) @ v.double()
        torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=0)
    assert (out - attend(q, k, v, model.scheme, 0, ctx)).abs().max() > 0  # the span hid keys


def test_kernel_choice_for_spans() -> None:
    """Chunks without a bias take the block road; windows and biased chunks the windowed one; a span that hides
    nothing at this length, the plain roads."""
    q = torch.zeros(1, 2, 13, 16)
    for name, span, kernel in [
        ("nope", Span("chunked", 4), BlockCausal),
        ("rope", Span("sliding", 4), Windowed),
        ("alibi", Span("chunked", 4), Windowed),
        ("t5", Span("sliding", 4), Windowed),
    ]:
        model = GPT(TINY, config_class(name)(), 48, 16)
        state = AttentionState(model.scheme, model.context(torch.zeros(1, 13, dtype=torch.long)))
        assert isinstance(choose_kernel(describe(state, q, span=span)), kernel), (name, span)
        covered = describe(state, q, span=Span(span.kind, 13))
        assert covered.span == FULL and not isinstance(choose_kernel(covered), Windowed | BlockCausal)


def test_windowed_memory_is_linear_in_length() -> None:
    """A window's chunk scores n·(n + W) values: at 64k tokens and W = 64 the chunk is thousands of queries, not
    the T² of a full mask (the budget is BIAS_CHUNK_BYTES)."""
    span = Span("sliding", 64)
    n = span.queries_per_chunk(2**24)
    assert n * (n + 64) <= 2**24 < (n + 1) * (n + 65)


def test_kv_cache_rows_with_spans_equal_the_full_forward() -> None:
    """Decoding one token at a time with a windowed or chunked layer gives the full forward's logits."""
    for layers in (
        [{"name": "rope", "span": "sliding", "window": 3}, {"name": "alibi", "span": "chunked", "window": 4}],
        [{"name": "t5", "span": "sliding", "window": 2}, {"name": "nope", "temperature": 0.5, "floor_scale": 2}],
    ):
        cfg = dataclasses.replace(config_class("layout")(), layers=layers)
        torch.manual_seed(0)
        model = lively(GPT(TINY, cfg, 48, 8))
        idx = torch.randint(0, 48, (2, 11), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            full = model(idx)
            cache = model.new_cache()
            steps = [model(idx[:, :5], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(5, 11)]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
