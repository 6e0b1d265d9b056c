"""`posenc viz` on per-layer layouts: one encoding block per distinct scheme, and attention recomputed with each
layer's own scheme, span (sliding, chunked) and query temperature equals the model's."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from attention_utils import attention_weights, force_chunks
from rich.console import Console
from scheme_utils import hybrid_schemes, n_layer_for

from posenc_cli.analysis import viz, viz_data
from posenc_cli.config import ModelConfig
from posenc_cli.model import GPT
from posenc_cli.positional import build_scheme, config_class
from posenc_cli.positional.layout import LayoutConfig
from posenc_cli.positional.span import Span

D, H, V, L = 32, 4, 61, 16


def layout(name: str, n_layer: int = 2):  # a Layout
    return build_scheme(config_class(name)(name=name), ModelConfig(d_model=D, n_layer=n_layer_for(name, n_layer),
                                                                   n_head=H), L)  # fmt: skip


# A layout of bias schemes and a remap under spans: the windowed kernel with a bias, the remapped kernel with a span.
MIXED = [
    {"name": "alibi", "span": "sliding", "window": 5},
    {"name": "fire", "span": "chunked", "window": 6},
    {"name": "rope", "span": "sliding", "window": 7, "remap": {"method": "self-extend", "window": 3, "group": 2}},
    {"name": "nope", "temperature": 0.3, "floor_scale": 3},
]


def tiny_gpt(name: str, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    pos = LayoutConfig(layers=MIXED) if name == "mixed" else config_class(name)(name=name)
    n_layer = len(MIXED) if name == "mixed" else n_layer_for(name)
    return GPT(ModelConfig(d_model=D, n_layer=n_layer, n_head=H, init_std=0.2), pos, V, L).eval()


def render(renderables: list) -> str:
    console = Console(file=io.StringIO(), width=160, force_terminal=True, color_system="truecolor")
    for r in renderables:
        console.print(r)
    return console.file.getvalue()


@pytest.mark.parametrize("name", hybrid_schemes())
def test_every_hybrid_renders_one_block_per_scheme(name: str, tmp_path: Path) -> None:
    """Each layer is drawn once, under the scheme it uses; spans and temperatures get their own pictures."""
    scheme = layout(name)
    enc = viz_data.layout_encoding(scheme, 24)
    ctx = viz_data.prepared_context(scheme, 24)
    views = [scheme.layer_view(i, ctx) for i in range(scheme.n_layer)]
    assert sorted(i for d in enc.sections for i in d.layers) == list(range(scheme.n_layer))
    for data in enc.sections:
        first = views[data.layers[0]].scheme
        assert all(views[i].scheme is first for i in data.layers) and data.scheme == first.name
        assert data.hooks == tuple(first.hooks)
    assert len(enc.sections) == len({id(v.scheme) for v in views})
    spans = {v.span for v in views if not v.span.is_full}
    assert {p.span for p in enc.spans} == spans
    for pic in enc.spans:
        visible = ~np.isnan(pic.mask)
        i, j = np.indices(pic.mask.shape)
        assert np.array_equal(visible, (j <= i) & pic.span.visible(torch.arange(len(i)), torch.arange(len(i))).numpy())
    temps = {v.temperature for v in views if v.temperature is not None}
    assert {p.temperature for p in enc.temperatures} == temps
    path = viz.save_figure(viz.layout_figure(enc), tmp_path / f"{name}.png", dpi=30)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = render(viz.layout_terminal(enc))
    for data in enc.sections:
        assert viz.section_title(data, name) in text
    for i, line in enumerate(scheme.describe_layers()):
        assert f"layer {i}: {line}" in text
    with pytest.raises(TypeError, match="layout_encoding"):
        viz_data.encoding_data(scheme, 24)


def test_layer_selects_its_scheme_and_options_name_the_difference() -> None:
    """gemma3: two RoPE schemes that differ in base; --layer 5 draws the global one alone, its bias layer 5."""
    enc = viz_data.layout_encoding(layout("gemma3"), 16)
    assert [(d.layers, d.options) for d in enc.sections] == [((0, 1, 2, 3, 4), ""), ((5,), "base=1e+06")]
    assert [(p.span, p.layers) for p in enc.spans] == [(Span("sliding", 4), (0, 1, 2, 3, 4))]
    only = viz_data.layout_encoding(layout("gemma3"), 16, layer=5)
    assert [d.layers for d in only.sections] == [(5,)] and only.spans == []
    irope = viz_data.layout_encoding(layout("irope"), 16, layer=3)
    assert [d.scheme for d in irope.sections] == ["nope"] and len(irope.temperatures) == 1
    factor = irope.temperatures[0].factor  # 1 + 0.1·log1p(⌊(n + 1)/4⌋), F = L/4 = 4
    np.testing.assert_allclose(factor, 1 + 0.1 * np.log1p(np.floor((np.arange(16) + 1) / 4)), rtol=1e-6)


@pytest.mark.parametrize("name", ["irope", "gemma3", "rnope-swa", "mixed"])
@pytest.mark.parametrize("chunk", [None, 5])
def test_weights_times_v_is_each_layers_attention(name: str, chunk: int | None) -> None:
    """Recomputed weights hide what each layer's span hides and, times v, give the layer's own output (its kernel:
    windowed, block-causal or fused; the temperature is in q)."""
    model = tiny_gpt(name)
    force_chunks(model, chunk)
    B, T = 2, 23  # longer than the windows and chunks (L/4 = 4)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    ctx = model.context(idx)
    x = model.embed(idx, ctx)
    pos = torch.arange(T)
    with torch.no_grad():
        items = list(viz_data.layer_views(model, idx))
        for item, block, att in zip(items, model.blocks, model.layer_attention(ctx), strict=True):
            view = item.view
            w = attention_weights(item.q, item.k, view.scheme, item.layer, view.ctx, chunk=chunk,
                                  span=view.span)  # fmt: skip  # (B, H, T, T)
            torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T))
            hidden = pos[None, :] > pos[:, None]
            if not view.span.is_full:
                hidden |= ~view.span.visible(pos, pos)
            assert torch.all(w[..., hidden] == 0) and torch.all(w[..., ~hidden] > 0)
            y = (w @ item.v).transpose(1, 2).reshape(B, T, D)  # (B, T, D)
            own = att.view  # the same layer's view in this test's forward
            expected = block.attn(block.norm1(x), own.scheme, own.ctx, True, None, att.state, own.span,
                                  own.temperature)  # fmt: skip
            torch.testing.assert_close(block.attn.proj(y), expected, atol=1e-5, rtol=1e-4)
            x = block.run(x, att)
    assert any(not i.view.span.is_full for i in items)


def test_temperature_is_in_the_recomputed_queries() -> None:
    """irope's NoPE layer: q is the block's q times the floor-log factor of each token index."""
    model = tiny_gpt("irope")
    idx = torch.randint(0, V, (1, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        items = list(viz_data.layer_views(model, idx))
        ctx = model.context(idx)
        x = model.embed(idx, ctx)
        for block, att in zip(model.blocks[:3], model.layer_attention(ctx)[:3], strict=True):
            x = block.run(x, att)
        view = items[3].view
        plain, _, _ = model.blocks[3].attn.qkv_heads(model.blocks[3].norm1(x), view.scheme, view.ctx)
    assert view.temperature is not None
    factor = view.temperature.factor(torch.arange(20))  # (T,)
    assert factor[-1] > 1.1
    torch.testing.assert_close(items[3].q, plain * factor[:, None])


@pytest.mark.parametrize("name", ["rnope-swa", "irope"])
def test_panel_maps_and_mass_follow_each_layers_span(name: str) -> None:
    model = tiny_gpt(name)
    T = 40
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(2))
    panel = viz_data.panel_for_windows(model, idx, 2.5, [0, 3], [-1, 1], map_size=T)
    assert panel.status == "ok" and panel.pool == 1 and panel.mass is not None
    i, j = np.indices((T, T))
    span = model.scheme.layer_view(0, model.context(idx)).span
    assert not span.is_full
    shown = (j <= i) & span.visible(torch.arange(T), torch.arange(T)).numpy()
    for h in (-1, 1):
        np.testing.assert_array_equal(~np.isnan(panel.maps[(0, h)]), shown)  # layer 0: its span
        np.testing.assert_array_equal(~np.isnan(panel.maps[(3, h)]), j <= i)  # layer 3: full NoPE
        np.testing.assert_allclose(np.nansum(panel.maps[(0, h)], axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(panel.mass.sum(-1), 1.0, rtol=1e-6)
    assert np.all(panel.mass[:3, :, 4:] == 0)  # windows and chunks of 4 tokens: nothing 4 or more back
    assert np.all(panel.mass[3, :, 4:].sum(-1) > 0.1)
