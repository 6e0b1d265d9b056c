"""The numbers behind `posenc viz`: what a scheme's hooks do, and where trained models attend.

Everything here is computed by the same code that trains the models: the scheme's own hooks (`embed`, `rotate`,
`bias`) for the encoding pictures, and the run's own blocks (`qkv_heads`, `scheme.bias`, the causal mask of
`posenc_cli.attention`) for the attention pictures. The figures (`posenc_cli.analysis.viz`) only draw these arrays.

Attention weights are recomputed explicitly, softmax(q·kᵀ/√hd + bias + mask), because SDPA returns none; queries
are processed in chunks (as the model does on its bias path), so no (T, T) tensor larger than one chunk exists.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from posenc_cli.attention import bias_chunk_size, fold_causal_mask, merged_scores, remap_applies
from posenc_cli.attention.scored import chunk_logits, visible_keys
from posenc_cli.config import Config
from posenc_cli.data.cache import eval_windows
from posenc_cli.errors import ConfigError, DataError, LengthBeyondScheme
from posenc_cli.evaluation.corpus import CorpusCache
from posenc_cli.positional import PositionalScheme, PositionContext, build_scheme
from posenc_cli.positional.base import LayerView
from posenc_cli.positional.layout import is_layout
from posenc_cli.positional.span import FULL, Span
from posenc_cli.positional.temperature import FloorLog

MATRIX_LENGTH = 256  # the (i, j) bias matrix covers the first positions only (a picture, not a table)
MAP_SIZE = 256  # attention maps longer than this are pooled into about this many query/key blocks
MAX_MAPS = 32  # more (layer, head) maps than this in one figure is unreadable: ask for a layer or a head


# ----------------------------------------------------------------------------------------------------------------
# Encodings: one array per hook the scheme uses.


@dataclass
class RotaryData:
    """What `rotate` does, measured on probe vectors of head `head`.

    angles: (T, P) unwrapped rotation angle (radians) of each rotated pair at positions 0..T−1.
    pairs: the P (a, b) dimension pairs that rotate into each other, in frequency order (lowest a first).
    similarity: (T,) q·k / hd for all-ones q and k, query at position T−1 and key at distance d = 0..T−1.
    """

    angles: np.ndarray
    pairs: list[tuple[int, int]]
    similarity: np.ndarray
    head: int


@dataclass
class BiasData:
    """What `bias` adds to the attention scores of layer `layer`.

    by_distance: (H, T) bias for the query at position T−1 and the key at distance d = 0..T−1.
    matrix: (M, M) bias of head `head` over the first M positions, NaN where the causal mask hides the key.
    content_dependent: the bias changed with the (random) q and k it was given, so it is one random draw.
    """

    by_distance: np.ndarray
    matrix: np.ndarray
    head: int
    layer: int
    content_dependent: bool


@dataclass
class EncodingData:
    """Everything `viz encoding` draws for one scheme; a part is None when the scheme does not use that hook."""

    scheme: str
    length: int
    train_length: int
    d_model: int
    n_head: int
    head_dim: int
    hooks: tuple[str, ...]
    source: str  # "parameter-free", "learned parameters at initialisation (seed 0)", "trained run X (step N)"
    paper: str = ""
    additive: np.ndarray | None = None  # (T, D) what `embed` adds to the token embeddings
    rotary: RotaryData | None = None
    bias: BiasData | None = None
    layers: tuple[int, ...] = ()  # in a layout: the layers that use this scheme (empty: a plain scheme, every layer)
    options: str = ""  # in a layout: the scheme's options that differ from its defaults ("base=1e+06")

    @property
    def empty(self) -> bool:
        return self.additive is None and self.rotary is None and self.bias is None


def seeded_scheme(cfg: Config, seed: int | None = None) -> PositionalScheme:
    """The scheme of `cfg`, its learned parameters (if any) initialised from `seed` (default `train.seed`)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.train.seed if seed is None else seed)
        scheme = build_scheme(cfg.pos, cfg.model, cfg.train.seq_len)
    return scheme.eval()


def prepared_context(scheme: PositionalScheme, length: int, device: torch.device | None = None) -> PositionContext:
    """Positions 0..length−1 with the scheme's tables, after its length check (as `GPT.context` does)."""
    scheme.check_length(length)
    ctx = PositionContext(positions=torch.arange(length, device=device))
    scheme.prepare(ctx)
    return ctx


def additive_grid(scheme: PositionalScheme, ctx: PositionContext) -> np.ndarray:
    """(T, D) what the embed hook adds: embed(0) on zero token embeddings."""
    zeros = torch.zeros(1, ctx.seq_len, scheme.d_model)  # (1, T, D)
    return scheme.embed(zeros, ctx)[0].double().numpy()


def _rotate_q(scheme: PositionalScheme, q: Tensor, ctx: PositionContext) -> Tensor:
    """Rotate probe queries (keys get the same probes; only the queries are read)."""
    return scheme.rotate(q, q.clone(), ctx)[0]


def rotary_pairs(scheme: PositionalScheme, head: int = 0) -> list[tuple[int, int]]:
    """The dimension pairs the rotate hook mixes, found from what it does to unit vectors at position 1.

    Unit vector e_a rotates into cos·e_a + sin·e_b; b is the dimension it picks up. Dimensions that pass through
    unchanged (partial rotary) belong to no pair. Layout-independent: rotate_half gives (k, k + d/2),
    interleaved (2k, 2k + 1).
    """
    hd = scheme.head_dim
    ctx = prepared_context(scheme, 2)
    probes = torch.eye(hd)[:, None, None, :].expand(hd, scheme.n_head, 2, hd).contiguous()  # (hd, H, 2, hd)
    out = _rotate_q(scheme, probes, ctx)  # (hd, H, 2, hd), or 2·hd wide for a polar scheme
    if out.shape[-1] == 2 * hd:  # polar (PoPE): component c's Cartesian pair is (c, c + hd), cos half then sin half
        return [(c, c + hd) for c in range(hd)]
    cols = out[:, head, 1, :].double().abs()  # (hd, hd): row a = R(1)·e_a
    cols.fill_diagonal_(0.0)
    partner = cols.argmax(dim=1).tolist()
    moved = (cols.max(dim=1).values > 0).tolist()
    pairs = []
    for a in range(hd):
        b = partner[a]
        if moved[a] and a < b and partner[b] == a:
            pairs.append((a, b))
    return pairs


def rotary_data(scheme: PositionalScheme, ctx: PositionContext, head: int = 0) -> RotaryData:
    """Rotation angle per (position, pair) and the all-ones q·k similarity vs distance, both from `rotate`."""
    T, H, hd = ctx.seq_len, scheme.n_head, scheme.head_dim
    pairs = rotary_pairs(scheme, head)
    if not pairs:
        raise ConfigError(f"scheme '{scheme.name}' has a rotate hook but rotates no pair of dimensions")
    a_idx = torch.tensor([a for a, _ in pairs])
    b_idx = torch.tensor([b for _, b in pairs])
    probe = torch.zeros(1, H, T, hd)  # (1, H, T, hd): e_a of every pair, at once (pairs are disjoint)
    probe[..., a_idx] = 1.0
    rotated = _rotate_q(scheme, probe, ctx)[0, head].double()  # (T, hd)
    wrapped = torch.atan2(rotated[:, b_idx], rotated[:, a_idx]).numpy()  # (T, P) in (−π, π]
    angles = np.unwrap(wrapped, axis=0)  # steps < π per position for every frequency ≤ 1 rad

    ones = torch.ones(1, H, T, hd)
    q, k = scheme.rotate(ones, ones.clone(), ctx)
    q_last = q[0, head, -1].double()  # (hd,) query at position T−1
    keys = k[0, head].double().flip(0)  # (T, hd): row d is the key at position T−1−d
    similarity = (keys @ q_last / hd).numpy()  # (T,)
    return RotaryData(angles=angles, pairs=pairs, similarity=similarity, head=head)


def _broadcast_bias(bias: Tensor | None, H: int, Tq: int, Tk: int) -> Tensor:
    if bias is None:
        return torch.zeros(H, Tq, Tk, dtype=torch.float64)
    return torch.broadcast_to(bias, (1, H, Tq, Tk))[0].double()  # (H, Tq, Tk)


def bias_data(
    scheme: PositionalScheme,
    ctx: PositionContext,
    *,
    layer: int = 0,
    head: int = 0,
    seed: int = 0,
    matrix_length: int = MATRIX_LENGTH,
) -> BiasData:
    """Call the bias hook with random q, k ~ N(0, 1): bias vs distance (every head) and the (i, j) matrix (one head).

    A second, independent draw tells whether the bias depends on q and k (CoPE) or only on positions (ALiBi, T5).
    """
    T, H, hd = ctx.seq_len, scheme.n_head, scheme.head_dim
    gen = torch.Generator().manual_seed(seed)
    q, k, q2, k2 = (torch.randn(1, H, T, hd, generator=gen) for _ in range(4))  # (1, H, T, hd) each
    pos = ctx.token_index  # bias hooks and the causal mask take token indexes (ids: ctx.ids_at)
    with torch.no_grad():
        if "content" in scheme.hooks and layer not in ctx.content:  # a bias read from a layer input: draw one too
            x = torch.randn(1, T, scheme.d_model, generator=gen)
            ctx.content[layer] = scheme.content(layer, x, ctx)
        last = _broadcast_bias(scheme.bias(layer, q[:, :, -1:], k, pos[-1:], pos, ctx), H, 1, T)  # (H, 1, T)
        other = _broadcast_bias(scheme.bias(layer, q2[:, :, -1:], k2, pos[-1:], pos, ctx), H, 1, T)
        M = min(T, matrix_length)
        m = _broadcast_bias(scheme.bias(layer, q[:, :, :M], k[:, :, :M], pos[:M], pos[:M], ctx), H, M, M)[head]
    matrix = m.numpy().copy()
    matrix[np.triu_indices(M, 1)] = np.nan  # keys after the query are masked
    return BiasData(
        by_distance=last[:, 0].flip(-1).numpy(),  # (H, T): index d is the key at position T−1−d
        matrix=matrix,
        head=head,
        layer=layer,
        content_dependent=not torch.allclose(last, other, rtol=1e-5, atol=1e-6),
    )


def encoding_data(
    scheme: PositionalScheme, length: int, *, source: str | None = None, head: int = 0, layer: int = 0, seed: int = 0
) -> EncodingData:
    """The arrays of every hook `scheme` uses, at positions 0..length−1 (read from the hooks, never by name)."""
    if is_layout(scheme):
        raise TypeError(f"pos={scheme.name} gives each layer its own scheme: draw it with layout_encoding")
    if length < 2:
        raise ConfigError(f"--length must be at least 2, got {length}")
    if not 0 <= head < scheme.n_head:
        raise ConfigError(f"--head {head}: the model has {scheme.n_head} heads (0..{scheme.n_head - 1})")
    if not 0 <= layer < scheme.n_layer:
        raise ConfigError(f"--layer {layer}: the model has {scheme.n_layer} layers (0..{scheme.n_layer - 1})")
    if source is None:
        learned = any(True for _ in scheme.parameters())
        source = "parameter-free"
        if learned:
            source = f"learned parameters at initialisation, seed {seed}; give a run directory for trained ones"
    hooks = tuple(scheme.hooks)
    data = EncodingData(
        scheme=scheme.name,
        length=length,
        train_length=scheme.train_length,
        d_model=scheme.d_model,
        n_head=scheme.n_head,
        head_dim=scheme.head_dim,
        hooks=hooks,
        source=source,
        paper=scheme.paper,
    )
    with torch.no_grad():
        ctx = prepared_context(scheme, length)
        if "embed" in hooks:
            data.additive = additive_grid(scheme, ctx)
        if "rotate" in hooks:
            data.rotary = rotary_data(scheme, ctx, head)
        if "bias" in hooks:
            data.bias = bias_data(scheme, ctx, layer=layer, head=head, seed=seed)
    return data


@dataclass
class SpanPicture:
    """A sliding or chunked span of a layout and the layers that use it; mask (n, n): 1 where query i may attend
    to key j (causal and the span), NaN elsewhere, over the first n positions."""

    span: Span
    layers: tuple[int, ...]
    mask: np.ndarray


@dataclass
class TemperaturePicture:
    """A query temperature of a layout and the layers that use it; factor (T,): q's factor at token index n."""

    temperature: FloorLog
    layers: tuple[int, ...]
    factor: np.ndarray


@dataclass
class LayoutEncoding:
    """What `viz encoding` draws for a per-layer layout (`positional.layout`): one `EncodingData` per distinct
    scheme (each naming the layers that use it), each distinct sliding or chunked span, each query temperature, and
    one line per layer (`describe_layers`)."""

    layout: str
    length: int
    train_length: int
    paper: str
    layer_lines: list[str]
    sections: list[EncodingData]
    spans: list[SpanPicture] = field(default_factory=list)
    temperatures: list[TemperaturePicture] = field(default_factory=list)


MASK_SIZE = 32  # positions of a span's mask picture


def option_text(cfg: Any) -> str:
    """The fields of a scheme's config that differ from the class defaults, as `key=value` (nested: `a.b=v`)."""
    try:
        defaults = dataclasses.asdict(type(cfg)())
    except TypeError:  # a config class without defaults for every field: name nothing
        return ""
    out: list[str] = []

    def walk(value: Any, default: Any, prefix: str) -> None:
        if isinstance(value, dict) and isinstance(default, dict):
            for key in value:
                walk(value[key], default.get(key), f"{prefix}{key}.")
        elif value != default and prefix[:-1] != "name":
            shown = f"{value:g}" if isinstance(value, float) else str(value)
            out.append(f"{prefix[:-1]}={shown}")

    walk(dataclasses.asdict(cfg), defaults, "")
    return ", ".join(out)


def layers_text(layers: Sequence[int]) -> str:
    """'layer 3', 'layers 0, 1, 2' (runs of consecutive layers as 'layers 0–4')."""
    items = list(layers)
    if len(items) == 1:
        return f"layer {items[0]}"
    if items == list(range(items[0], items[-1] + 1)) and len(items) > 2:
        return f"layers {items[0]}–{items[-1]}"
    return "layers " + ", ".join(map(str, items))


def layout_encoding(
    layout: Any, length: int, *, source: str | None = None, head: int = 0, layer: int | None = None, seed: int = 0
) -> LayoutEncoding:
    """The encodings of a layout's layers at positions 0..length−1: each distinct scheme's hooks (`encoding_data`,
    its bias drawn at the first layer that uses it), or with `layer` only that layer's scheme (bias at `layer`)."""
    if length < 2:
        raise ConfigError(f"--length must be at least 2, got {length}")
    n_layer = layout.n_layer
    if layer is not None and not 0 <= layer < n_layer:
        raise ConfigError(f"--layer {layer}: the model has {n_layer} layers (0..{n_layer - 1})")
    with torch.no_grad():
        ctx = prepared_context(layout, length)
        views = [layout.layer_view(i, ctx) for i in range(n_layer)]
    groups: dict[int, list[int]] = {}
    for i, view in enumerate(views):
        if layer is None or layer == i or view.scheme is views[layer].scheme:
            groups.setdefault(id(view.scheme), []).append(i)
    sections = []
    for members in groups.values():
        scheme = views[members[0]].scheme
        at = members[0] if layer is None else layer
        data = encoding_data(scheme, length, source=source, head=head, layer=at, seed=seed)
        data.layers, data.options = tuple(members), option_text(scheme.cfg)
        sections.append(data)
    shown = sorted(i for members in groups.values() for i in members)
    spans: dict[Span, list[int]] = {}
    temperatures: dict[FloorLog, list[int]] = {}
    for i in shown:
        if not views[i].span.is_full:
            spans.setdefault(views[i].span, []).append(i)
        if views[i].temperature is not None:
            temperatures.setdefault(views[i].temperature, []).append(i)
    n = min(length, MASK_SIZE)
    index = torch.arange(length)
    return LayoutEncoding(
        layout=layout.name,
        length=length,
        train_length=layout.train_length,
        paper=layout.paper,
        layer_lines=[f"layer {i}: {line}" for i, line in enumerate(layout.describe_layers())],
        sections=sections,
        spans=[SpanPicture(sp, tuple(ls), span_mask(sp, n)) for sp, ls in spans.items()],
        temperatures=[
            TemperaturePicture(t, tuple(ls), t.factor(index).double().numpy()) for t, ls in temperatures.items()
        ],
    )


def span_mask(span: Span, n: int) -> np.ndarray:
    """(n, n) 1.0 where query i may attend to key j under causality and `span`, NaN where it may not."""
    visible = visible_pairs(span, 0, n).numpy()
    return np.where(visible > 0, 1.0, np.nan)


# ----------------------------------------------------------------------------------------------------------------
# Attention of a trained model.


@dataclass(frozen=True, eq=False)
class LayerQKV:
    """One layer's q, k, v (B, H, T, hd) as the block computes them, and the `LayerView` it attends with (its
    scheme, that scheme's context, its span and its temperature, already applied to q)."""

    layer: int
    q: Tensor
    k: Tensor
    v: Tensor
    view: LayerView


def layer_views(model: Any, idx: Tensor) -> Iterator[LayerQKV]:
    """Run `model` (a GPT) on idx (B, T) block by block; yield each layer's `LayerQKV`.

    q and k come from the block's own `qkv_heads` with the layer's view (`GPT.layer_attention`): the layer's scheme
    and context, the forward's length scale and the layer's query temperature, so they are exactly the training
    ones; the residual stream then continues through the unmodified block (`Block.run`). Raises
    `LengthBeyondScheme` as the model does.
    """
    ctx = model.context(idx)
    x = model.embed(idx, ctx)  # (B, T, D)
    for layer, (block, att) in enumerate(zip(model.blocks, model.layer_attention(ctx), strict=True)):
        view = att.view
        h = block.options.attention_input(block.norm1(x), view.ctx, None)  # the model options' hooks (Canon A)
        q, k, v = block.attn.qkv_heads(h, view.scheme, view.ctx, None, att.state, view.temperature, block.options)
        yield LayerQKV(layer, q, k, v, view)
        x = block.run(x, att)


def attention_chunks(
    q: Tensor,
    k: Tensor,
    scheme: PositionalScheme,
    layer: int,
    ctx: PositionContext,
    *,
    chunk: int | None = None,
    span: Span = FULL,
) -> Iterator[tuple[int, Tensor]]:
    """softmax(q·kᵀ/√hd + bias + causal and span masks) by query chunks: yield (start, weights (B, H, Tq, end)).

    Chunk [start, end) sees keys [0, end) only (all later keys are masked), exactly like `attention.attend`;
    `span` (the layer's, `positional.span`) hides the keys a sliding or chunked layer does not see (weight 0).
    """
    B, H, T, hd = q.shape
    chunk = chunk if chunk is not None else bias_chunk_size(B, H, T)
    pos = ctx.token_index  # bias hooks and the causal mask take token indexes (ids: ctx.ids_at)
    window = scheme.remap_window if remap_applies(scheme.remap_window, ctx) else 0  # Self-Extend, ReRoPE
    q2, k2 = scheme.remap(q.float(), k.float(), ctx) if window else (q, k)
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        qc, kc = q[:, :, start:end], k[:, :, :end]  # (B, H, Tq, hd), (B, H, Tk, hd)
        q_pos, k_pos = pos[start:end], pos[:end]
        if scheme.owns_scores:  # the scheme's own logits and/or weights, as the Scored road computes them
            logits = chunk_logits(scheme, layer, qc, kc, q_pos, k_pos, ctx)
            visible = visible_keys(q_pos, k_pos, True, span)
            yield start, scheme.normalise(layer, logits, q_pos, k_pos, visible, ctx)
            continue
        if window:  # the normal and the remapped scores, merged by distance as `attention.attend_remapped` does
            scores = merged_scores(q.float(), k.float(), q2, k2, window, ctx, start, end, end)  # (B, H, Tq, Tk)
        else:
            scores = (qc.float() @ kc.float().transpose(-1, -2)) / math.sqrt(hd)  # (B, H, Tq, Tk)
        bias = scheme.bias(layer, qc, kc, q_pos, k_pos, ctx) if scheme.has_bias else None
        scores = scores + fold_causal_mask(bias, q_pos, k_pos, torch.float32, causal=True, span=span)
        yield start, torch.softmax(scores, dim=-1)


def pool_rows(w: Tensor, start: int, T: int, factor: int) -> tuple[Tensor, Tensor]:
    """Pool one chunk of attention rows w (Tq, Tk ≤ T) into blocks of `factor` positions.

    Returns (sums (nb, nb), counts (nb,)): per query block, the summed (over its queries) mass in each key block,
    and how many queries it holds. sums / counts is the mean row of a block: rows still sum to 1.
    """
    Tq, Tk = w.shape
    nb = -(-T // factor)
    keys = torch.zeros(Tq, nb * factor, dtype=torch.float64)
    keys[:, :Tk] = w.double()
    per_key_block = keys.view(Tq, nb, factor).sum(-1)  # (Tq, nb)
    block = torch.arange(start, start + Tq) // factor  # (Tq,)
    sums = torch.zeros(nb, nb, dtype=torch.float64).index_add_(0, block, per_key_block)
    counts = torch.zeros(nb, dtype=torch.float64).index_add_(0, block, torch.ones(Tq, dtype=torch.float64))
    return sums, counts


def visible_pairs(span: Span, start: int, n: int) -> Tensor:
    """(n, start + n) 1.0 where query start + i may attend to key j (causal, and the layer's `span`), else 0.0."""
    q_pos, k_pos = torch.arange(start, start + n), torch.arange(start + n)
    visible = k_pos[None, :] <= q_pos[:, None]  # (n, start + n)
    by_span = span.visible(q_pos, k_pos)
    if by_span is not None:
        visible &= by_span
    return visible.double()


def mass_by_distance(w: Tensor, start: int, T: int) -> Tensor:
    """Attention mass of one chunk w (B, H, Tq, Tk) summed by distance d = i − j: (H, T), summed over B and queries."""
    _, H, Tq, Tk = w.shape
    dist = (torch.arange(start, start + Tq)[:, None] - torch.arange(Tk)[None, :]).flatten()  # (Tq·Tk,)
    keep = dist >= 0
    flat = w.double().sum(0).reshape(H, Tq * Tk)[:, keep]  # (H, kept)
    return torch.zeros(H, T, dtype=torch.float64).index_add_(1, dist[keep], flat)


@dataclass
class AttentionPanel:
    """Attention of one run at one length.

    maps: {(layer, head): (n, n) mean weights of window 0, queries × keys, pooled into blocks of `pool` positions
    (head −1 = the mean over heads); NaN where the causal mask, or the layer's span (a sliding window, chunks),
    hides every pair of the block}. Rows sum to 1.
    mass: (n_layer, n_head, T) share of attention mass at distance d, over every query of every window (sums to 1
    over d). status "n/a" (with `reason`) when the scheme cannot serve `length` (learned positions).
    """

    length: int
    multiple: float
    status: Literal["ok", "n/a"] = "ok"
    reason: str | None = None
    windows: int = 0
    pool: int = 1
    maps: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    mass: np.ndarray | None = None

    def mean_distance(self) -> np.ndarray:
        """(n_layer,) expected attended distance per layer (mean over heads)."""
        assert self.mass is not None
        return (self.mass.mean(1) * np.arange(self.mass.shape[-1])).sum(-1)

    def weight_by_distance(self) -> np.ndarray:
        """(n_layer, n_head, T) mean attention weight at distance d over the queries that reach it (i ≥ d).

        `mass` divides by every query; only T − d of the T queries of a window can look d tokens back.
        """
        assert self.mass is not None
        T = self.mass.shape[-1]
        return self.mass * T / (T - np.arange(T))


@dataclass
class AttentionReport:
    run: str
    scheme: str
    train_length: int
    n_layer: int
    n_head: int
    panels: list[AttentionPanel]
    layers: list[int]
    heads: list[int]  # [-1] = mean over heads
    layer_notes: list[str] = field(default_factory=list)  # a layout: each layer's scheme, span, temperature
    dropped_at: int | None = None  # DroPE: the step after which the model attends without positions (None: never)


def panel_for_windows(
    model: Any, idx: Tensor, multiple: float, layers: Sequence[int], heads: Sequence[int], map_size: int = MAP_SIZE
) -> AttentionPanel:
    """Attention maps of window 0 and the mass by distance over all windows idx (B, T), for every layer."""
    B, T = idx.shape
    panel = AttentionPanel(length=T, multiple=multiple, windows=B, pool=max(1, -(-T // map_size)))
    H, L = model.config.n_head, model.config.n_layer
    try:
        model.scheme.check_length(T)
    except LengthBeyondScheme as e:
        panel.status, panel.reason = "n/a", f"{e.scheme} supports at most {e.limit} positions"
        return panel
    nb = -(-T // panel.pool)
    mass = torch.zeros(L, H, T, dtype=torch.float64)
    sums = {(layer, h): torch.zeros(nb, nb, dtype=torch.float64) for layer in layers for h in heads}
    counts = torch.zeros(nb, dtype=torch.float64)
    seen = {layer: torch.zeros(nb, nb, dtype=torch.float64) for layer in layers}  # visible (query, key) pairs
    first = next(iter(sums), None)
    chunk = max(panel.pool, bias_chunk_size(B, H, T) // panel.pool * panel.pool)  # whole blocks per chunk
    with torch.no_grad():
        for item in layer_views(model, idx):
            layer, view = item.layer, item.view
            chunks = attention_chunks(item.q, item.k, view.scheme, layer, view.ctx, chunk=chunk, span=view.span)
            for start, w in chunks:
                w = w.cpu()
                mass[layer] += mass_by_distance(w, start, T)
                if layer in seen:
                    seen[layer] += pool_rows(visible_pairs(view.span, start, w.shape[2]), start, T, panel.pool)[0]
                for h in heads if layer in layers else ():  # maps of the selected layers only
                    rows = w[0].mean(0) if h < 0 else w[0, h]  # (Tq, Tk) of window 0
                    s, c = pool_rows(rows, start, T, panel.pool)
                    sums[(layer, h)] += s
                    if (layer, h) == first:
                        counts += c
    for (layer, h), s in sums.items():
        m = (s / counts[:, None]).numpy()
        m[seen[layer].numpy() == 0] = np.nan  # blocks the causal mask or the layer's span hide entirely
        panel.maps[(layer, h)] = m
    panel.mass = (mass / (B * T)).numpy()
    return panel


def validation_windows(val: np.ndarray, length: int, windows: int) -> Tensor:
    """The first `windows` non-overlapping held-out windows of `length` tokens: (N, length) int64."""
    if len(val) < length + 1:
        raise DataError(
            f"the validation split has {len(val)} tokens; a window of {length} needs {length + 1} "
            "(try a smaller --length)"
        )
    return eval_windows(val, length, length, max_windows=windows)[:, :-1]


def parse_index(value: str, count: int, what: str, *, allow_mean: bool = False) -> list[int]:
    """'all' -> 0..count−1, 'mean' -> [−1] (heads), 'K' -> [K]; `ConfigError` naming the valid range otherwise."""
    text = value.strip().lower()
    if text == "all":
        return list(range(count))
    if allow_mean and text == "mean":
        return [-1]
    try:
        k = int(text)
    except ValueError:
        k = None
    if k is None or not 0 <= k < count:
        extra = ", all or mean" if allow_mean else " or all"
        raise ConfigError(f"--{what} {value}: the run has {count} {what}s; use 0..{count - 1}{extra}")
    return [k]


def run_train_length(run: Any) -> int:
    return run.meta.lengths(run.config)[0]


def attention_report(
    run: Any,
    *,
    length: int | None = None,
    multiple: float = 4.0,
    layer: str = "all",
    head: str = "mean",
    maps: bool = True,
    windows: int = 4,
    val: np.ndarray | None = None,
    map_size: int = MAP_SIZE,
    max_maps: int | None = MAX_MAPS,
) -> AttentionReport:
    """Attention of a loaded run at its training length and at `length` tokens (default `multiple` × training
    length), on the first `windows` held-out validation windows. `maps=False`: mass by distance only."""
    model = run.model
    cfg = model.config
    L = run_train_length(run)
    long = round(multiple * L) if length is None else length
    if long < 2:
        raise ConfigError(f"--length must be at least 2, got {long}")
    if windows < 1:
        raise ConfigError(f"--windows must be at least 1, got {windows}")
    layers = parse_index(layer, cfg.n_layer, "layer") if maps else []
    heads = parse_index(head, cfg.n_head, "head", allow_mean=True) if maps else []
    n_maps = 2 * len(layers) * len(heads)
    if max_maps is not None and n_maps > max_maps:
        raise ConfigError(
            f"--layer {layer} --head {head} would draw {n_maps} maps (at most {max_maps}); pick one layer or one head"
        )
    if val is None:
        val = CorpusCache().get(run.config.data, run).val
    device = next(model.parameters()).device
    panels = []
    for n in dict.fromkeys([L, long]):
        idx = validation_windows(val, n, windows).to(device)
        panels.append(panel_for_windows(model, idx, n / L, layers, heads, map_size))
    return AttentionReport(
        run=Path(run.path).name,
        scheme=str(run.config.pos.name),
        train_length=L,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        panels=panels,
        layers=layers,
        heads=heads,
        layer_notes=model.scheme.describe_layers() if is_layout(model.scheme) else [],
        dropped_at=run.positions_dropped_at,
    )
