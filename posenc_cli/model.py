"""Decoder-only transformer (GPT-2 shape, pre-norm) whose only positional information comes from a scheme's hooks.

The model never names a scheme: one `PositionalScheme` instance is built from the config, `prepare`d once per
forward, and then asked to (a) add to the token embeddings, (b) rotate q and k in every layer, (c) bias attention
scores (see `posenc_cli.attention`). Schemes that do not use a hook inherit a no-op. Each layer attends with the
scheme's `layer_view` of it: the scheme itself and full attention for a plain scheme; for a scheme that arranges
others per layer (`posenc_cli.positional`'s hybrids), the layer's own scheme, span and temperature. Each forward makes
one `AttentionState` per distinct scheme, which its layers share: the attention kernel is chosen there, once per
distinct setting, from the scheme's hooks, the layer's span and q's dtype and device; the model itself has no
branch on a scheme or a road.

`model.embedding` picks the embedding recipe for every scheme alike: `gpt2` (token table N(0, init_std²), used as
is) or `fairseq` (the baselines of Press et al. 2022, fairseq's `transformer_lm`: token table N(0, 1/D) times √D,
so tokens start at unit scale, and a sinusoid added unscaled). See `ModelConfig.embed_scale`.

Model options (`posenc_cli.options`: trained sink logits, the output gate, QK-norm, Canon layers) are built per block
from `model=` (`LayerOptions`, given the layer's scheme) and called through their hooks at fixed points of the block
and the attention layer; with none switched on a block has no option parameters and computes what it did before.

`GPT.drop_positions()` removes the positional encoding from a model in place (DroPE, Gelberg et al. 2025, arXiv
2512.12167): the scheme is replaced by `NoPositions`, the base class's no-op hooks, so no layer embeds, rotates or
biases any more, and the scheme's own parameters leave the model; each layer keeps its span (a hybrid's sliding
window or chunks) and temperature, as the reference keeps Qwen2's `sliding_window` (`run.drope`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from posenc_cli.attention import AttentionState, CausalSelfAttention
from posenc_cli.config import Config, ModelConfig, PosConfig
from posenc_cli.kv_cache import KVCache
from posenc_cli.options import LayerOptions, enabled
from posenc_cli.positional import PositionalScheme, PositionContext, build_scheme
from posenc_cli.positional.base import Documents, LayerView
from posenc_cli.positional.span import FULL, Span
from posenc_cli.positional.temperature import FloorLog


def make_norm(cfg: ModelConfig) -> nn.Module:
    """LayerNorm (with a bias when `cfg.bias`) or RMSNorm over d_model."""
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=1e-5)
    return nn.LayerNorm(cfg.d_model, eps=1e-5, bias=cfg.bias)


class MLP(nn.Module):
    """d_model -> mlp_ratio·d_model -> GELU -> d_model (`proj` is a residual projection)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = cfg.mlp_ratio * cfg.d_model
        self.fc = nn.Linear(cfg.d_model, hidden, bias=cfg.bias)
        self.act = nn.GELU()
        self.proj = nn.Linear(hidden, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, hidden: Callable[[Tensor], Tensor] | None = None) -> Tensor:
        """x (B, T, D) -> (B, T, D); `hidden`: applied to the hidden layer (B, T, mlp_ratio·D) before the activation."""
        h = self.fc(x)
        if hidden is not None:
            h = hidden(h)
        return self.drop(self.proj(self.act(h)))


class Block(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)), with the model options' hooks (`options`, none by
    default; `scheme`: the scheme this layer attends with, which an option may read when it is built)."""

    def __init__(self, cfg: ModelConfig, layer: int, scheme: PositionalScheme | None = None) -> None:
        super().__init__()
        self.norm1 = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg, layer)
        self.norm2 = make_norm(cfg)
        self.mlp = MLP(cfg)
        self.options = LayerOptions(cfg, layer, scheme)

    def forward(
        self,
        x: Tensor,
        scheme: PositionalScheme,
        ctx: PositionContext,
        causal: bool = True,
        cache: KVCache | None = None,
        state: AttentionState | None = None,
        span: Span = FULL,
        temperature: FloorLog | None = None,
    ) -> Tensor:
        options = self.options
        h = options.attention_input(self.norm1(x), ctx, cache)
        x = x + self.attn(h, scheme, ctx, causal, cache, state, span, temperature, options)
        hidden = partial(options.mlp_hidden, ctx=ctx, cache=cache) if options else None
        return x + self.mlp(options.mlp_input(self.norm2(x), ctx, cache), hidden)

    def run(self, x: Tensor, layer: LayerAttention, causal: bool = True, cache: KVCache | None = None) -> Tensor:
        """`forward` with the layer's view and state (`GPT.layer_attention`)."""
        view = layer.view
        return self(x, view.scheme, view.ctx, causal, cache, layer.state, view.span, view.temperature)


class NoPositions(PositionalScheme):
    """What `GPT.drop_positions` leaves in place of the scheme: the base class's hooks, which do nothing, so order
    enters only through the causal mask and each layer's `layers` (span, temperature), the dropped scheme's layer
    views; None (runs dropped before posenc kept them): every layer full, no temperature. It has no parameters and
    no position limit, and ignores the position ids. Not registered: it is a state a trained model reaches, never a
    `pos=` choice."""

    name = "dropped"
    relative = True  # ignores the ids

    def __init__(
        self,
        cfg: PosConfig,
        model: ModelConfig,
        train_length: int,
        layers: tuple[tuple[Span, FloorLog | None], ...] | None = None,
    ) -> None:
        super().__init__(cfg, model, train_length)
        self.layers = layers

    def layer_view(self, layer: int, ctx: PositionContext) -> LayerView:
        if self.layers is None:
            return super().layer_view(layer, ctx)
        span, temperature = self.layers[layer]
        return LayerView(self, ctx, span, temperature)


@dataclass(frozen=True, eq=False)
class LayerAttention:
    """One layer's `LayerView` (scheme, context, span, temperature) and the forward's `AttentionState` for its
    scheme (one per distinct scheme and context: layers that share a scheme share tables and kernel choices)."""

    view: LayerView
    state: AttentionState


class GPT(nn.Module):
    """Causal LM: idx (B, T) -> logits (B, T, V), with tied input/output embeddings."""

    def __init__(self, model: ModelConfig, pos: PosConfig, vocab_size: int, train_length: int) -> None:
        super().__init__()
        self.config = model
        self.pos_config = pos
        self.vocab_size = vocab_size
        self.train_length = train_length
        self.scheme: PositionalScheme = build_scheme(pos, model, train_length)
        self.wte = nn.Embedding(vocab_size, model.d_model)
        self.drop = nn.Dropout(model.dropout)
        schemes = layer_schemes(self.scheme, model.n_layer) if enabled(model) else [None] * model.n_layer
        self.blocks = nn.ModuleList(Block(model, i, schemes[i]) for i in range(model.n_layer))
        self.norm_f = make_norm(model)
        self.lm_head = nn.Linear(model.d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.embed_scale = model.embed_scale  # √D for the fairseq recipe, 1 for gpt2
        self._init_weights()

    def _init_weights(self) -> None:
        """N(0, init_std) for linear/embedding weights, zero biases; residual projections get init_std/√(2·n_layer)
        (GPT-2). The scheme's own parameters keep the scheme's initialisation."""
        std = self.config.init_std
        for module in [self.wte, *self.blocks, self.norm_f]:
            for m in module.modules():
                if isinstance(m, nn.Linear | nn.Embedding):  # the token table: the recipe's std (1/√D for fairseq)
                    nn.init.normal_(m.weight, mean=0.0, std=self.config.embed_init_std if m is self.wte else std)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)
        resid_std = std / math.sqrt(2 * self.config.n_layer)
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, mean=0.0, std=resid_std)
            nn.init.normal_(block.mlp.proj.weight, mean=0.0, std=resid_std)

    @property
    def positions_dropped(self) -> bool:
        """Whether `drop_positions` removed the scheme."""
        return isinstance(self.scheme, NoPositions)

    @property
    def keeps_layout(self) -> bool:
        """Whether the dropped model kept its layers' spans and temperatures (`drop_positions(keep_layout=)`)."""
        return isinstance(self.scheme, NoPositions) and self.scheme.layers is not None

    def drop_positions(self, keep_layout: bool = True) -> None:
        """Remove the positional encoding, in place (DroPE's switch): the scheme becomes `NoPositions`, its
        parameters (a position table, trained slopes, ...) leave `parameters()` and `state_dict()`, and every other
        weight is kept as it is. `keep_layout`: each layer keeps its span and temperature (False: every layer full,
        none, as runs dropped before posenc kept them). Build a new optimizer (and wrappers such as DDP) over the
        parameters afterwards. Idempotent."""
        if not self.positions_dropped:
            layers = None
            if keep_layout:
                ctx = PositionContext(positions=torch.arange(2, device=self.wte.weight.device))  # views only
                self.scheme.prepare(ctx)
                views = [self.scheme.layer_view(i, ctx) for i in range(len(self.blocks))]
                layers = tuple((v.span, v.temperature) for v in views)
            self.scheme = NoPositions(self.pos_config, self.config, self.train_length, layers)

    def num_parameters(self, include_embedding: bool = True) -> int:
        """Parameter count (tied weights counted once)."""
        n = sum(p.numel() for p in self.parameters())
        return n if include_embedding else n - self.wte.weight.numel()

    def context(
        self,
        idx: Tensor,
        position_ids: Tensor | None = None,
        documents: Tensor | None = None,
        *,
        cell_length: int | tuple[int, ...] | None = None,
    ) -> PositionContext:
        """Check the length and build the per-forward position context (position ids, scheme tables).

        position_ids: None for 0..T−1 (nothing extra is computed), or int ids (T,), (1, T) or (B, T), non-negative,
        one per token of idx (B, T); a scheme with a position limit (`max_length`) refuses ids at or past it.
        documents: None, or (B, T) int document ids of packed rows (`Documents.from_ids`); without position_ids the
        ids are then each token's index within its document.
        cell_length: the evaluation cell's length in tokens (`PositionContext.cell_length`; None: T), or one per row
        (a tuple of B: a padded batch of prompts from cells of different lengths).
        """
        T = idx.shape[1]
        docs = None if documents is None else Documents.from_ids(checked_documents(documents, idx))
        if docs is not None and position_ids is None:
            position_ids = docs.local  # (B, T) positions from 0 at each document's first token
        if position_ids is None:
            self.scheme.check_length(T)
            ctx = PositionContext(positions=torch.arange(T, device=idx.device))
        else:
            ids, max_position = checked_position_ids(position_ids, idx)
            self.scheme.check_length(max_position + 1)
            index = torch.arange(T, device=idx.device)
            ctx = PositionContext(positions=ids, index=index, max_position=max_position, documents=docs)
        if cell_length is not None:
            ctx.cell_length = checked_cell_length(cell_length, idx.shape[0])
        self.scheme.prepare(ctx)
        return ctx

    def embed(self, idx: Tensor, ctx: PositionContext) -> Tensor:
        """Token embeddings plus the scheme's embedding hook: (B, T) -> (B, T, D)."""
        tokens = self.wte(idx)  # (B, T, D)
        if self.embed_scale != 1.0:
            tokens = tokens * self.embed_scale
        return self.drop(self.scheme.embed(tokens, ctx))

    def forward(
        self,
        idx: Tensor,
        *,
        causal: bool = True,
        position_ids: Tensor | None = None,
        documents: Tensor | None = None,
        cache: KVCache | None = None,
        cell_length: int | tuple[int, ...] | None = None,
    ) -> Tensor:
        """idx (B, T) int64 -> logits (B, T, V). `causal=False` drops the mask (analysis/tests only;
        refused for a `causal_only` scheme).

        position_ids: (T,) or (B, T) position ids (default 0..T−1), what the scheme encodes; the causal mask keeps
        following token order whatever the ids (see `PositionContext`). (B, n_layer, T): each layer its own ids
        (randomized positions drawn per layer, `positional.ids`); the embedding hook reads layer 0's.

        documents: packed rows, (B, T) int64 document ids: a query attends only to keys of its own document (a
        contiguous run of equal ids; −1: a pad, a document of one token), with the span and token-order
        temperatures counted from the document's first token (`positional.base.Documents`). Give position_ids
        restarting at 0 per document (the default then) and each document's logits are those it gets alone in a
        row. None: one sequence per row, exactly as without the argument. Left pads (−1 before a row's tokens) are
        how a batch of prompts of different lengths is decoded (`evaluation.passkey.greedy_decode`).

        cache: incremental decoding (`new_cache`, `posenc_cli.kv_cache`). idx are then the tokens after the Tc
        cached ones; their logits equal the full forward's over all Tc + T tokens (causal only, eval mode), and
        their keys and values are appended to the cache. position_ids, if given, are the new tokens' ids;
        documents, if given, the new tokens' document ids (the cache keeps every token's: once a forward gave them,
        a later forward without them continues each row's last document).

        cell_length: the tokens of the evaluation cell (a cell-level temperature's s, `PositionContext.cell_length`),
        or a tuple of one per row; None: T, or with a cache the length the cache holds (`KVCache.cell`), so that
        full and cached forwards of one cell given the same length compute the same.
        """
        if not causal and self.scheme.causal_only:
            raise ValueError(f"{self.scheme.name} is defined for causal attention only: no non-causal forward")
        if cache is not None:
            return self._forward_cached(idx, cache, position_ids, cell_length, documents)
        per_layer = layer_ids(position_ids, len(self.blocks))  # (B, n_layer, T) or None
        ctx = self.context(
            idx, position_ids if per_layer is None else per_layer[:, 0], documents, cell_length=cell_length
        )
        contexts = None
        if per_layer is not None:  # layer i's own prepared context
            contexts = [ctx] + [
                self.context(idx, per_layer[:, i], documents, cell_length=cell_length)
                for i in range(1, len(self.blocks))
            ]
        layers = self.layer_attention(ctx, contexts)  # each layer's scheme, span, and the shared tables and kernels
        x = self.embed(idx, ctx)  # (B, T, D)
        for block, layer in zip(self.blocks, layers, strict=True):
            x = block.run(x, layer, causal)
        return self.lm_head(self.norm_f(x))  # (B, T, V)

    def layer_attention(
        self, ctx: PositionContext, contexts: list[PositionContext] | None = None
    ) -> list[LayerAttention]:
        """Every layer's view of the prepared `ctx` (`PositionalScheme.layer_view`; `contexts`: one per layer, for
        ids drawn per layer) with one `AttentionState` per distinct (scheme, context): a plain scheme's layers all
        share one, as the layers a hybrid gives one scheme do.
        """
        states: dict[tuple[int, int], AttentionState] = {}
        out = []
        for i in range(len(self.blocks)):
            view = self.scheme.layer_view(i, ctx if contexts is None else contexts[i])
            key = (id(view.scheme), id(view.ctx))
            if key not in states:
                states[key] = AttentionState(view.scheme, view.ctx)
            out.append(LayerAttention(view, states[key]))
        return out

    def new_cache(self, cell_length: int | tuple[int, ...] | None = None, room: int | None = None) -> KVCache:
        """An empty key/value cache for `forward(..., cache=)`, for an evaluation cell of `cell_length` tokens, or one
        per row (None: its first forward's length); `room`: the tokens per row, pads included, its buffers are sized
        for (None: the cell's)."""
        return KVCache(len(self.blocks), cell_length, room)

    def _forward_cached(
        self,
        idx: Tensor,
        cache: KVCache,
        position_ids: Tensor | None,
        cell_length: int | tuple[int, ...] | None = None,
        documents: Tensor | None = None,
    ) -> Tensor:
        """The new tokens idx (B, Tq) after cache's Tc: one context over all Tc + Tq positions, layers on the new
        rows only (a scheme's embed hook, where it has one, sees the whole length, the cached rows zero, so that
        position tables line up). Documents (left pads): the cache's and the new tokens' (`KVCache.documents`)."""
        if self.training:
            raise RuntimeError("the KV cache is for inference: call model.eval() first")
        B, Tq = idx.shape
        Tc = cache.length
        full = idx.new_empty((B, Tc + Tq))  # only its shape and device are read
        ids = None
        if position_ids is not None or cache.ids is not None:
            if position_ids is None:
                raise ValueError("this cache holds explicit position ids: give the new tokens' position_ids")
            per_layer = layer_ids(position_ids, len(self.blocks))
            new_ids = (
                checked_position_ids(position_ids, idx)[0] if per_layer is None else per_layer.long().to(idx.device)
            )
            old_ids = cache.ids if cache.ids is not None else torch.arange(Tc, device=idx.device)
            if old_ids.dim() != new_ids.dim():  # give both the larger shape: (B, T), or (B, n_layer, T) per layer
                shape = (B, len(self.blocks)) if max(old_ids.dim(), new_ids.dim()) == 3 else (B,)
                old_ids, new_ids = widened(old_ids, shape, Tc), widened(new_ids, shape, Tq)
            ids = torch.cat([old_ids.to(idx.device), new_ids], dim=-1)  # (Tc + Tq,), (B, ..) or (B, n_layer, ..)
        docs = cache.documents_with(None if documents is None else checked_documents(documents, idx), Tq)
        cell = cache.cell(cell_length, Tc + Tq)
        first = ids if ids is None or ids.dim() < 3 else ids[:, 0]
        ctx = self.context(full, first, docs, cell_length=cell)  # checks first
        contexts = None
        if ids is not None and ids.dim() == 3:
            contexts = [ctx] + [
                self.context(full, ids[:, i], docs, cell_length=cell) for i in range(1, len(self.blocks))
            ]
        tokens = self.wte(idx)  # (B, Tq, D)
        if self.embed_scale != 1.0:
            tokens = tokens * self.embed_scale
        x = tokens
        if type(self.scheme).embed is not PositionalScheme.embed:  # an embedding hook: position tables line up
            padded = tokens.new_zeros(B, Tc + Tq, tokens.shape[-1])  # (B, Tc + Tq, D)
            padded[:, Tc:] = tokens
            x = self.scheme.embed(padded, ctx)[:, Tc:]  # (B, Tq, D)
        for block, layer in zip(self.blocks, self.layer_attention(ctx, contexts), strict=True):
            x = block.run(x, layer, True, cache)
        if ids is not None:
            cache.ids = ids
        cache.documents = docs
        return self.lm_head(self.norm_f(x))  # (B, Tq, V)


def layer_schemes(scheme: PositionalScheme, n_layer: int) -> list[PositionalScheme]:
    """The scheme each layer attends with (`layer_view`'s; each layer's own under a per-layer arrangement), read
    from a context of two positions, as `GPT.drop_positions` reads the spans."""
    ctx = PositionContext(positions=torch.arange(2))
    scheme.prepare(ctx)
    return [scheme.layer_view(i, ctx).scheme for i in range(n_layer)]


def widened(ids: Tensor, shape: tuple[int, ...], T: int) -> Tensor:
    """Ids (T,), (B, T) or (B, n_layer, T) expanded to (*shape, T): a per-row (B, T) gains the layer dimension."""
    if ids.dim() == 2 and len(shape) == 2:
        ids = ids[:, None]  # (B, 1, T)
    return ids.expand(*shape, T)


def layer_ids(position_ids: Tensor | None, n_layer: int) -> Tensor | None:
    """Per-layer ids (B, n_layer, T) as given (None for ids of one or two dimensions, which every layer shares);
    ValueError for three dimensions whose middle one is not `n_layer`."""
    if position_ids is None or position_ids.dim() != 3:
        return None
    if position_ids.shape[1] != n_layer:
        raise ValueError(
            f"per-layer position_ids {tuple(position_ids.shape)} need (B, {n_layer}, T) for {n_layer} layers"
        )
    return position_ids


def checked_position_ids(position_ids: Tensor, idx: Tensor) -> tuple[Tensor, int]:
    """Position ids for tokens idx (B, T) -> (ids as int64 on idx's device, the largest id).

    ids: (T,), (1, T) or (B, T). Raises ValueError naming the shapes for any other shape, for a non-integer dtype
    and for a negative id. One host sync (min and max together)."""
    B, T = idx.shape
    ids = position_ids
    fits = ids.dim() == 1 or (ids.dim() == 2 and ids.shape[0] in (1, B))
    if not fits or ids.shape[-1] != T:
        raise ValueError(f"position_ids of shape {tuple(ids.shape)} do not fit tokens of shape {(B, T)}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"position_ids must be integers, got {ids.dtype}")
    ids = ids.to(device=idx.device, dtype=torch.long)
    if ids.numel() == 0:
        return ids, -1
    lo, hi = (int(v) for v in torch.aminmax(ids))
    if lo < 0:
        raise ValueError(f"position_ids must be >= 0, got {lo}")
    return ids, hi


def checked_cell_length(cell_length: int | tuple[int, ...], batch: int) -> int | tuple[int, ...]:
    """An evaluation cell's length, or one per row (a tuple of `batch`) -> the same as ints; ValueError below 1 or
    for a tuple of another length."""
    if isinstance(cell_length, tuple):
        if len(cell_length) != batch:
            raise ValueError(f"{len(cell_length)} cell lengths do not fit a batch of {batch} rows")
        cells = tuple(int(c) for c in cell_length)
    else:
        cells = (int(cell_length),)
    if min(cells) < 1:
        raise ValueError(f"cell_length must be >= 1, got {cell_length}")
    return cells if isinstance(cell_length, tuple) else cells[0]


def checked_documents(documents: Tensor, idx: Tensor) -> Tensor:
    """Document ids for tokens idx (B, T) -> (B, T) int64 on idx's device; ValueError for another shape or a
    non-integer dtype."""
    if documents.shape != idx.shape:
        raise ValueError(f"documents of shape {tuple(documents.shape)} do not fit tokens of shape {tuple(idx.shape)}")
    if documents.dtype.is_floating_point or documents.dtype.is_complex or documents.dtype == torch.bool:
        raise ValueError(f"documents must be integers, got {documents.dtype}")
    return documents.to(device=idx.device, dtype=torch.long)


def build_model(cfg: Config, vocab_size: int) -> GPT:
    """The model of a run: sizes from `cfg.model`, scheme from `cfg.pos`, training length `cfg.train.seq_len`."""
    return GPT(cfg.model, cfg.pos, vocab_size, cfg.train.seq_len)
