"""`posenc viz` data and figures: encodings equal the papers' formulas, attention weights equal the model's."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from attention_utils import attention_weights, force_chunks, layer_qkv
from rich.console import Console
from scheme_utils import plain_schemes
from torch import Tensor

from posenc_cli.analysis import viz, viz_data
from posenc_cli.config import Config, ModelConfig, PosConfig
from posenc_cli.model import GPT
from posenc_cli.positional import PositionalScheme, PositionContext, config_class, registry
from posenc_cli.positional.alibi import alibi_slopes
from posenc_cli.run.config_load import config_from_dict

D, H, HD = 32, 4, 8


def config(pos: str, **pos_options: object) -> Config:
    return config_from_dict(
        {
            "model": {"d_model": D, "n_layer": 2, "n_head": H},
            "pos": {"name": pos, **pos_options},
            "train": {"seq_len": 16},
        }
    )


def encoding(pos: str, length: int = 40, **pos_options: object) -> viz_data.EncodingData:
    return viz_data.encoding_data(viz_data.seeded_scheme(config(pos, **pos_options)), length)


def render(renderables: list) -> str:
    console = Console(file=io.StringIO(), width=120, force_terminal=True, color_system="truecolor")
    for r in renderables:
        console.print(r)
    return console.file.getvalue()


# ----------------------------------------------------------------------------------------------------------------
# Encodings


@pytest.mark.parametrize("variant", ["vaswani", "t2t"])
def test_sinusoidal_grid_is_the_formula(variant: str) -> None:
    data = encoding("sinusoidal", 50, variant=variant)
    p = np.arange(50)[:, None]
    k = np.arange(D // 2)[None, :]
    if variant == "vaswani":  # Vaswani et al. §3.5: PE(p, 2k) = sin(p / 10000^(2k/D)), PE(p, 2k+1) = cos(...)
        angle = p / 10000.0 ** (2 * k / D)
        pe = np.empty((50, D))
        pe[:, 0::2], pe[:, 1::2] = np.sin(angle), np.cos(angle)
    else:  # tensor2tensor: ω_k = exp(−k·ln 10000 / (D/2 − 1)), [sin ‖ cos]
        angle = p * np.exp(-k * math.log(10000.0) / (D / 2 - 1))
        pe = np.concatenate([np.sin(angle), np.cos(angle)], axis=1)
    scale = ModelConfig().init_std  # default pos.scale: the model's init_std
    assert data.additive is not None and data.rotary is None and data.bias is None
    np.testing.assert_allclose(data.additive, scale * pe, atol=2e-7)
    fig = viz.encoding_figure(data)
    np.testing.assert_array_equal(fig.axes[0].images[0].get_array(), data.additive)  # the picture is the data


@pytest.mark.parametrize("n_head", [4, 6, 8, 12])
def test_alibi_panel_slopes(n_head: int) -> None:
    cfg = config_from_dict({"model": {"d_model": 8 * n_head, "n_head": n_head}, "pos": {"name": "alibi"}})
    data = viz_data.encoding_data(viz_data.seeded_scheme(cfg), 30)
    b = data.bias
    assert b is not None and not b.content_dependent
    slopes = -(b.by_distance[:, 1] - b.by_distance[:, 0])
    np.testing.assert_allclose(slopes, alibi_slopes(n_head).double().numpy(), rtol=1e-6)
    if n_head == 8:  # Press et al.: 1/2, 1/4, ..., 1/256
        np.testing.assert_allclose(slopes, 2.0 ** -np.arange(1, 9), rtol=1e-6)
    d = np.arange(30)
    np.testing.assert_allclose(b.by_distance, -slopes[:, None] * d[None, :], atol=1e-5)  # linear in distance
    i, j = np.tril_indices(30)
    np.testing.assert_allclose(b.matrix[i, j], -slopes[0] * (i - j), atol=1e-5)
    assert np.isnan(b.matrix[np.triu_indices(30, 1)]).all()
    lines = viz.encoding_figure(data).axes[0].get_lines()
    heads = [line for line in lines if line.get_label().startswith("head")]
    assert len(heads) == n_head
    for h, line in enumerate(heads):
        np.testing.assert_allclose(line.get_ydata(), b.by_distance[h])


@pytest.mark.parametrize(("layout", "fraction"), [("rotate_half", 1.0), ("interleaved", 1.0), ("rotate_half", 0.5)])
def test_rope_angles_are_p_theta(layout: str, fraction: float) -> None:
    T = 200  # far past 2π for the fast pairs: the angles must be unwrapped
    data = encoding("rope", T, layout=layout, rotary_fraction=fraction)
    rot = data.rotary
    assert rot is not None and data.additive is None and data.bias is None
    d = int(HD * fraction)
    theta = 10000.0 ** (-np.arange(0, d, 2) / d)  # Su et al.: θ_k = base^(−2k/d)
    p = np.arange(T)[:, None]
    np.testing.assert_allclose(rot.angles, p * theta[None, :], atol=2e-4, rtol=1e-5)
    half = [(k, k + d // 2) for k in range(d // 2)]
    interleaved = [(2 * k, 2 * k + 1) for k in range(d // 2)]
    assert rot.pairs == (half if layout == "rotate_half" else interleaved)
    # all-ones q, k: each rotated pair contributes 2·cos(distance·θ_k), each pass-through dim 1
    dist = np.arange(T)[:, None]
    sim = (2 * np.cos(dist * theta[None, :]).sum(1) + (HD - d)) / HD
    np.testing.assert_allclose(rot.similarity, sim, atol=1e-4)


@pytest.mark.parametrize("name", plain_schemes())
def test_every_scheme_renders_png_and_terminal(name: str, tmp_path: Path) -> None:
    """Every registered scheme (new ones included) gives a figure and a terminal grid from its hooks."""
    data = encoding(name, 16)
    path = viz.save_figure(viz.encoding_figure(data), tmp_path / f"{name}.png", dpi=40)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = render(viz.terminal_grids(data))
    assert text.strip()
    drawable = {"embed", "rotate", "bias"}  # content, logits and normalise read the tokens: nothing fixed to draw
    assert data.empty == (not set(registry()[name].hooks) & drawable)
    if data.additive is not None:
        assert "added to the embeddings" in text and "\x1b[" in text  # coloured cells
    if data.empty:
        assert ("no encoding to draw" in text) != bool(data.hooks)
        assert ("from the content" in text) == bool(data.hooks)


def test_nope_says_there_is_nothing_to_draw() -> None:
    data = encoding("nope")
    assert data.empty and data.hooks == ()
    fig = viz.encoding_figure(data)
    assert "no encoding to draw" in fig.axes[0].get_title() and "causal mask" in fig.axes[0].get_title()


def test_learned_table_is_the_initialisation_and_limited() -> None:
    cfg = config("learned")
    a = viz_data.encoding_data(viz_data.seeded_scheme(cfg), 16)
    b = viz_data.encoding_data(viz_data.seeded_scheme(cfg), 16)
    np.testing.assert_array_equal(a.additive, b.additive)  # deterministic for a seed
    scheme = viz_data.seeded_scheme(cfg)
    np.testing.assert_array_equal(a.additive, scheme.wpe.weight.detach().double().numpy())
    assert "initialisation" in a.source
    from posenc_cli.errors import LengthBeyondScheme

    with pytest.raises(LengthBeyondScheme):
        viz_data.encoding_data(scheme, 17)


@dataclass(kw_only=True)
class _ContentConfig(PosConfig):
    name: str = "content-test"


class ContentBias(PositionalScheme):
    """A test scheme with two hooks: a constant embedding and a content-dependent bias q·k (like CoPE)."""

    name = "content-test"
    config_cls = _ContentConfig
    hooks = ("embed", "bias")

    def embed(self, x: Tensor, ctx: PositionContext) -> Tensor:
        return x + 1.0

    def bias(self, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, ctx: PositionContext) -> Tensor:
        return q @ k.transpose(-1, -2)


def test_content_dependent_bias_uses_random_qk_and_says_so() -> None:
    scheme = ContentBias(_ContentConfig(), ModelConfig(d_model=D, n_layer=2, n_head=H), 16)
    data = viz_data.encoding_data(scheme, 12)
    assert data.bias is not None and data.bias.content_dependent
    assert data.additive is not None and np.all(data.additive == 1.0)
    fig = viz.encoding_figure(data)
    titles = [ax.get_title() for ax in fig.axes]
    assert any("random q, k" in t for t in titles)
    assert sum("embed hook" in t for t in titles) == 1 and sum("bias hook" in t for t in titles) == 1
    assert "random q/k" in render(viz.terminal_grids(data))


# ----------------------------------------------------------------------------------------------------------------
# Attention


def tiny_gpt(scheme: str, seed: int = 0, train_length: int = 16) -> GPT:
    torch.manual_seed(seed)
    model = GPT(ModelConfig(d_model=D, n_layer=2, n_head=H), config_class(scheme)(name=scheme), 61, train_length)
    return model.eval()


@pytest.mark.parametrize("scheme", ["alibi", "rope", "sinusoidal"])
@pytest.mark.parametrize("chunk", [None, 5])
def test_weights_times_v_is_the_models_attention(scheme: str, chunk: int | None) -> None:
    model = tiny_gpt(scheme)
    force_chunks(model, chunk)  # the model's own chunked bias path, where it has one
    idx = torch.randint(0, 61, (3, 23), generator=torch.Generator().manual_seed(1))
    ctx = model.context(idx)
    x = model.embed(idx, ctx)
    with torch.no_grad():
        for (layer, q, k, v, _), block in zip(layer_qkv(model, idx), model.blocks, strict=True):
            w = attention_weights(q, k, model.scheme, layer, ctx, chunk=chunk)  # (B, H, T, T)
            torch.testing.assert_close(w.sum(-1), torch.ones(3, H, 23))
            assert torch.all(w.triu(1) == 0)  # causal
            y = (w @ v).transpose(1, 2).reshape(3, 23, D)  # (B, T, D)
            expected = block.attn(block.norm1(x), model.scheme, ctx)  # SDPA inside
            torch.testing.assert_close(block.attn.proj(y), expected, atol=1e-5, rtol=1e-4)
            x = block(x, model.scheme, ctx)


def test_panel_rows_sum_to_one_and_mass_is_the_brute_force() -> None:
    model = tiny_gpt("alibi")
    idx = torch.randint(0, 61, (2, 40), generator=torch.Generator().manual_seed(2))
    panel = viz_data.panel_for_windows(model, idx, 2.5, [0, 1], [-1, 1], map_size=16)
    assert panel.status == "ok" and panel.pool == 3 and panel.windows == 2
    for m in panel.maps.values():
        assert m.shape == (14, 14)
        np.testing.assert_allclose(np.nansum(m, axis=1), 1.0, rtol=1e-6)
        assert np.isnan(m[np.triu_indices(14, 1)]).all()
    assert panel.mass is not None
    np.testing.assert_allclose(panel.mass.sum(-1), 1.0, rtol=1e-6)
    ctx = model.context(idx)
    with torch.no_grad():
        (layer, q, k, _, _), *_ = layer_qkv(model, idx)
        w = attention_weights(q, k, model.scheme, layer, ctx).double().numpy()  # (B, H, T, T)
    i, j = np.tril_indices(40)
    for d in (0, 1, 7, 39):
        sel = (i - j) == d
        brute = w[:, :, i[sel], j[sel]].sum((0, 2)) / (2 * 40)  # (H,)
        np.testing.assert_allclose(panel.mass[0, :, d], brute, rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(panel.weight_by_distance()[0, :, d], w[:, :, i[sel], j[sel]].mean((0, 2)))
    head1 = w[0, 1][:39, :39].reshape(13, 3, 13, 3).sum(3).mean(1)  # pooled 3×3 blocks of window 0, head 1
    np.testing.assert_allclose(panel.maps[(0, 1)][:13, :13][np.tril_indices(13)], head1[np.tril_indices(13)])
    again = viz_data.panel_for_windows(model, idx, 2.5, [0, 1], [-1, 1], map_size=16)
    np.testing.assert_array_equal(again.mass, panel.mass)  # deterministic


def test_learned_beyond_its_table_is_na() -> None:
    model = tiny_gpt("learned", train_length=16)
    idx = torch.zeros(1, 32, dtype=torch.long)
    panel = viz_data.panel_for_windows(model, idx, 2.0, [0], [0])
    assert panel.status == "n/a" and "at most 16 positions" in str(panel.reason) and panel.mass is None


def test_parse_index() -> None:
    from posenc_cli.errors import ConfigError

    assert viz_data.parse_index("all", 3, "layer") == [0, 1, 2]
    assert viz_data.parse_index("2", 3, "layer") == [2]
    assert viz_data.parse_index("mean", 4, "head", allow_mean=True) == [-1]
    for bad in ("3", "-1", "x", "mean"):
        with pytest.raises(ConfigError, match="0..2"):
            viz_data.parse_index(bad, 3, "layer")


def test_shades_stay_distinct() -> None:
    colours = viz.shades("#0072B2", 6)
    assert len(set(colours)) == 6
    assert colours[2] != colours[3]
