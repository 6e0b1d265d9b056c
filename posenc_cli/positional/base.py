"""The hooks through which a positional scheme plugs into the model.

A scheme can (a) add to the token embeddings, (b) rotate queries and keys, (c) add a bias to the attention scores.
A scheme whose positions are computed from the tokens may also (d) read each layer's input (`content`: per-token
features, kept in the KV cache beside the keys), (e) compute the attention logits itself (`logits`, replacing
q·kᵀ/√hd + bias) and (f) own the normaliser (`normalise`, replacing the softmax).
Each hook defaults to doing nothing, so a scheme overrides only what it uses. One scheme instance serves the whole
model: `prepare` runs once per forward and returns the content-independent tables (rotation angles, ...) that every
layer then reuses. Tables that depend only on shapes are kept in non-persistent buffers or recomputed, so a
checkpoint holds only learned parameters.

Position ids. Every token has a position id, by default its index 0..T−1. A forward may give other ids per token,
(T,) for every row or (B, T) one row per sequence, separately from the token's index, which is what causality uses
(the causal mask always follows token order). Hooks read the ids from `PositionContext.positions` (embed, rotate) or
through `PositionContext.ids_at` (bias, key_bias: these receive token indexes, as the mask does). A scheme computes
its positions from the ids only; `relative` says whether it sees them only through differences id_i − id_j.

Documents (packed rows, `PositionContext.documents`): several examples in one row, each attending only to its own
tokens, as if it were alone in a row from position 0 (`Documents`). The causal mask, a layer's span and the
token-order temperatures then follow each token's index within its document; a scheme that mixes tokens (a
cumulative sum, a short convolution) may rely on documents being contiguous runs of a row, and keeps a
convolution within one (PaTH).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.errors import LengthBeyondScheme
from posenc_cli.positional.span import FULL, Span
from posenc_cli.positional.temperature import FloorLog

Hook = Literal["embed", "rotate", "bias", "content", "logits", "normalise"]
OWNS_SCORES: tuple[Hook, ...] = ("logits", "normalise")  # hooks that take the attention scores out of SDPA
# FlexAttention's score_mod: (score, b, h, q_idx, kv_idx) -> score, all 0-d tensors (q_idx, kv_idx: token indexes)
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True, eq=False)
class Documents:
    """The documents of packed rows: segment (B, T) int64, the run of the row each token belongs to (0, 1, ...), and
    local (B, T) int64, the token's index within it (0 at each document's first token).

    Built from per-token document ids by `from_ids`: a document is a maximal run of equal ids, and every token of
    id −1 (padding) is a document of its own, so a pad sees only itself and no softmax row is empty."""

    segment: Tensor
    local: Tensor

    @classmethod
    def from_ids(cls, ids: Tensor) -> Documents:
        """(B, T) int document ids (equal neighbours: one document; −1: padding) -> `Documents`."""
        B, T = ids.shape
        index = torch.arange(T, device=ids.device).expand(B, T)  # (B, T)
        starts = torch.ones_like(ids, dtype=torch.bool)
        starts[:, 1:] = (ids[:, 1:] != ids[:, :-1]) | (ids[:, 1:] == -1)  # a new run, or a pad on its own
        segment = starts.long().cumsum(-1) - 1  # (B, T)
        first = torch.where(starts, index, torch.zeros_like(index)).cummax(-1).values  # (B, T) its run's first token
        return cls(segment, index - first)

    def same(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(Tq,), (Tk,) token indexes -> bool (B, 1, Tq, Tk): True where query and key share a document."""
        return (self.segment[:, q_pos, None] == self.segment[:, None, k_pos])[:, None]

    def local_at(self, index: Tensor) -> Tensor:
        """(N,) token indexes -> (B, N) their indexes within their documents."""
        return self.local[:, index]

    def visible(self, q_pos: Tensor, k_pos: Tensor, span: Span = FULL) -> Tensor:
        """(Tq,), (Tk,) token indexes -> bool (B, 1, Tq, Tk): the same document, and within it the keys `span` shows
        at the tokens' indexes within their document (causality apart)."""
        same = self.same(q_pos, k_pos)  # (B, 1, Tq, Tk)
        shown = span.visible(self.local_at(q_pos), self.local_at(k_pos))  # (B, Tq, Tk) or None
        return same if shown is None else same & shown[:, None]


@dataclass
class PositionContext:
    """What one forward pass shares between layers.

    positions: int64 position ids of the tokens, (T,) shared by every row or (B, T) one row per sequence.
    tables: scheme-owned tensors computed once by `prepare` (e.g. cos/sin tables), read by every layer.
    index: (T,) token indexes 0..T−1 when the ids were given explicitly; None for the default ids, where `positions`
        is arange(T) and serves as both (nothing extra is built or gathered).
    max_position: the largest id (a host int) when the ids were given explicitly; None for the default ids.
    content: per layer, the `content` hook's features of all T tokens (B, H, T, F), cached ones included; filled
        by each attention layer before its bias, logits and normalise hooks run.
    documents: packed rows (`Documents`): each token attends only within its document; None: one sequence per row.
    cell_length: the tokens of the evaluation cell this forward belongs to, which a cell-level temperature reads
        (DroPE's β, `temperatures.drope`), or a tuple of one per row (a padded batch of prompts from cells of
        different lengths: `row_cells`); None: the forward's own T (`cell_tokens`).
    """

    positions: Tensor
    tables: dict[str, Any] = field(default_factory=dict)
    index: Tensor | None = None
    max_position: int | None = None
    content: dict[int, Tensor] = field(default_factory=dict)
    documents: Documents | None = None
    cell_length: int | tuple[int, ...] | None = None

    @property
    def seq_len(self) -> int:
        """T, the number of tokens."""
        return int(self.positions.shape[-1])

    @property
    def length(self) -> int:
        """Positions the ids reach, max id + 1 (T for the default ids): what a length-dependent scaling sees."""
        return self.seq_len if self.max_position is None else self.max_position + 1

    @property
    def cell_tokens(self) -> int:
        """The evaluation cell's length in tokens: `cell_length`, or T when none was given (per row: the longest)."""
        if self.cell_length is None:
            return self.seq_len
        return max(self.cell_length) if isinstance(self.cell_length, tuple) else self.cell_length

    def row_cells(self, batch: int) -> tuple[int, ...]:
        """Each row's evaluation cell length (`cell_length` per row, else `cell_tokens` for all `batch` rows)."""
        return self.cell_length if isinstance(self.cell_length, tuple) else (self.cell_tokens,) * batch

    @property
    def token_index(self) -> Tensor:
        """(T,) the tokens' indexes 0..T−1: the order causality uses."""
        return self.positions if self.index is None else self.index

    def ids_at(self, index: Tensor) -> Tensor:
        """Position ids of the tokens at `index` (N,) -> (N,) or (B, N); `index` itself for the default ids."""
        return index if self.index is None else self.positions[..., index]


@dataclass(frozen=True, eq=False)
class LayerView:
    """What one layer of one forward attends with: the scheme whose hooks it calls, that scheme's position context,
    the layer's attention span and its query temperature (None: none). A plain scheme is every layer's scheme, with
    the full span; a layout (`posenc_cli.positional.layout`) gives each layer its own."""

    scheme: PositionalScheme
    ctx: PositionContext
    span: Span = FULL
    temperature: FloorLog | None = None


class PositionalScheme(nn.Module):
    """Base class of all schemes. Subclasses set the class attributes and override one to three hooks."""

    name: ClassVar[str]
    config_cls: ClassVar[type[PosConfig]] = PosConfig
    hooks: ClassVar[tuple[Hook, ...]] = ()
    extrapolates: ClassVar[bool] = True
    paper: ClassVar[str] = ""
    # True when `bias` returns the same tensor for every layer and reads neither q nor k (only positions and the
    # scheme's parameters): the model may then build it once per forward and share it between layers.
    bias_shared_across_layers: ClassVar[bool] = False
    # True when the logits depend on the position ids only through differences id_i − id_j, so that shifting every
    # id by one constant changes nothing (up to rounding). Vacuously true for a scheme that ignores the ids.
    relative: ClassVar[bool] = False
    # True when the scheme is defined for causal attention only (gates or sums over the keys up to the query): the
    # model refuses a non-causal forward instead of returning logits the scheme does not define.
    causal_only: ClassVar[bool] = False

    def __init__(self, cfg: PosConfig, model: ModelConfig, train_length: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_head = model.n_head
        self.n_layer = model.n_layer
        self.head_dim = model.head_dim
        self.d_model = model.d_model
        self.train_length = train_length

    # -- limits --------------------------------------------------------------------------------------------------
    @property
    def max_length(self) -> int | None:
        """Longest sequence this scheme can serve; None means unlimited."""
        return None

    def check_length(self, length: int) -> None:
        """Raise `LengthBeyondScheme` when `length` positions cannot be served."""
        limit = self.max_length
        if limit is not None and length > limit:
            raise LengthBeyondScheme(self.name, limit, length)

    @property
    def has_bias(self) -> bool:
        return "bias" in self.hooks

    @property
    def owns_scores(self) -> bool:
        """Whether the scheme computes the logits or the attention weights itself (`logits`, `normalise`): then no
        fused kernel can run it, and the kernel choice takes `posenc_cli.attention.scored.Scored`."""
        return any(h in self.hooks for h in OWNS_SCORES)

    # -- layers --------------------------------------------------------------------------------------------------
    def layer_view(self, layer: int, ctx: PositionContext) -> LayerView:
        """The scheme, context, span and temperature layer `layer` attends with in the forward of `ctx` (prepared).
        Default: this scheme in every layer, full span, no temperature."""
        return LayerView(self, ctx, FULL, None)  # given, not defaulted: torch.compile traces a global, not a default

    def describe_layers(self) -> list[str]:
        """One line per layer for reports: '<scheme>' (a layout names each layer's scheme and span)."""
        return [self.name] * self.n_layer

    # -- hooks ---------------------------------------------------------------------------------------------------
    def prepare(self, ctx: PositionContext) -> None:
        """Fill `ctx.tables` once per forward (default: nothing to precompute)."""

    def embed(self, x: Tensor, ctx: PositionContext) -> Tensor:
        """Hook (a): x (B, T, D) token embeddings -> (B, T, D)."""
        return x

    def rotate(self, q: Tensor, k: Tensor, ctx: PositionContext) -> tuple[Tensor, Tensor]:
        """Hook (b): q, k (B, H, T, hd) -> rotated q, k of the same shapes."""
        return q, k

    def rotate_rows(self, q: Tensor, k: Tensor, ctx: PositionContext, q_start: int) -> tuple[Tensor, Tensor]:
        """Hook (b) for decoding with a KV cache: q (B, H, T − q_start, hd), the queries of the token indexes
        [q_start, T) alone, and k (B, H, T, hd), every key -> what `rotate` makes of those q rows, and k.

        Default: q padded with zero rows to T, `rotate`d, its rows [q_start, T) returned (nothing to do without a
        `rotate`). A scheme whose rotation acts position by position overrides it to rotate the rows alone.
        """
        if type(self).rotate is PositionalScheme.rotate:
            return q, k
        B, H, _, hd = q.shape
        q, k = self.rotate(torch.cat([q.new_zeros(B, H, q_start, hd), q], dim=2), k, ctx)  # (B, H, T, hd)
        return q[:, :, q_start:], k

    @property
    def fixed_key_rotation(self) -> bool:
        """Whether `rotate` turns each key by its own position alone, the same in every forward whatever the length:
        a KV cache then keeps keys rotated once (`KVCache.rotated_keys`, `rotate_new`). Default False: every cached
        key is rotated again at each forward (length-dependent frequencies, or no positionwise rotation)."""
        return False

    def rotate_new(self, q: Tensor, k: Tensor, ctx: PositionContext, q_start: int) -> tuple[Tensor, Tensor]:
        """q, k (B, H, T − q_start, hd), the queries and keys of the token indexes [q_start, T) alone -> both as
        `rotate` turns those rows; only for a scheme with `fixed_key_rotation`."""
        raise NotImplementedError(f"{self.name} rotates keys again at every forward (fixed_key_rotation is False)")

    def bias(
        self, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, ctx: PositionContext
    ) -> Tensor | None:
        """Hook (c): additive attention-score bias.

        q: (B, H, Tq, hd) queries of one chunk, k: (B, H, Tk, hd) keys, q_pos: (Tq,), k_pos: (Tk,) their token
        indexes (the order causality uses); their position ids are `ctx.ids_at(q_pos)`, `ctx.ids_at(k_pos)`, (Tq,)
        or (B, Tq). Returns a tensor broadcastable to (B, H, Tq, Tk), or None. The causal mask is applied by the
        model.
        """
        return None

    def content(self, layer: int, x: Tensor, ctx: PositionContext) -> Tensor | None:
        """Hook (d): per-token features of layer `layer`'s input x (B, T, D), the normed hidden states the layer
        projects to q, k, v -> (B, H, T, F) fp32, or None. Feature t must read x_t alone (token by token), because
        with a KV cache x holds only the new tokens and the cached tokens' features are kept (`KVCache.content`).
        The layer stores the features of all T tokens in `ctx.content[layer]`, where the bias, logits and
        normalise hooks of that layer read them (e.g. FoX's forget gates, PaTH's Householder vectors); anything
        that mixes tokens (a cumulative sum, a short convolution) belongs in those hooks."""
        return None

    def logits(self, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, ctx: PositionContext) -> Tensor:
        """Hook (e), for a scheme with "logits" in `hooks`: the attention logits of one chunk of queries, replacing
        q·kᵀ/√hd + bias. q (B, H, Tq, hd), k (B, H, Tk, hd), q_pos (Tq,), k_pos (Tk,) token indexes, as for `bias`
        -> (B, H, Tq, Tk) fp32, already scaled. The causal mask and the span are applied after it."""
        raise NotImplementedError(f"scheme '{self.name}' lists no logits hook")

    def normalise(
        self, layer: int, logits: Tensor, q_pos: Tensor, k_pos: Tensor, visible: Tensor, ctx: PositionContext
    ) -> Tensor:
        """Hook (f): attention weights from the logits of one chunk, replacing the softmax. logits (B, H, Tq, Tk)
        fp32; q_pos (Tq,), k_pos (Tk,) token indexes; visible (Tq, Tk) bool, the keys each query may see (causality
        and the layer's span), or (B, 1, Tq, Tk) in packed rows (`ctx.documents`: also the query's own document)
        -> weights (B, H, Tq, Tk), zero where not visible; each row is what multiplies the
        values (it need not sum to 1). Default: the softmax over the visible keys."""
        return torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)

    @property
    def remap_window(self) -> int:
        """W > 0 when the scheme remaps positions beyond a window (Self-Extend, ReRoPE): pairs with id distance
        i − j < W take the normal scores, the others the scores of `remap`'s q and k. 0 (default): no remapping."""
        return 0

    def remap(self, q: Tensor, k: Tensor, ctx: PositionContext) -> tuple[Tensor, Tensor]:
        """Hook (b'), with `remap_window` > 0: q, k (B, H, T, hd) as `rotate` (and the length scale) left them ->
        the q, k of the remapped scores, same shapes. Default: unchanged."""
        return q, k

    def key_bias(self, k_pos: Tensor, ctx: PositionContext) -> Tensor | None:
        """Optional fast form of hook (c), for causal attention: (H, Tk) or (B, H, Tk) fp32 b with, for every layer
        and j ≤ i, bias(layer, ...)[h, i, j] = b[h, j] + c_h(i) for some per-query constant c_h(i), which no softmax
        row sees. k_pos: (Tk,) key token indexes (ids: `ctx.ids_at(k_pos)`). The model may then add b to the scores
        instead of calling `bias` (see `posenc_cli.attention`). Default None: not available; `bias` is used. A scheme
        that overrides it `offers_key_bias` and must return a tensor.
        """
        return None

    @property
    def offers_key_bias(self) -> bool:
        """Whether `key_bias` is available (the scheme overrides it): what the kernel choice reads, without calling
        the hook (`posenc_cli.attention.choose`)."""
        return type(self).key_bias is not PositionalScheme.key_bias

    def score_mod(self, layer: int, ctx: PositionContext) -> ScoreMod | None:
        """Optional pointwise form of hook (c), for FlexAttention (`posenc_cli.attention.flex`): a function
        (score, b, h, q_idx, kv_idx) -> score + bias(layer, ...)[b, h, q_idx, kv_idx] on 0-d tensors, q_idx and kv_idx
        token indexes (ids: `id_lookup(ctx)`), built from tensors `prepare` left in `ctx` (no Python branching on
        tensor values). It must equal `bias` wherever causal attention looks (and everywhere for non-causal). Default
        None: not available. A scheme that overrides it `offers_score_mod` and must return a function.
        """
        return None

    @property
    def offers_score_mod(self) -> bool:
        """Whether `score_mod` is available (the scheme overrides it), read by the kernel choice without calling it."""
        return type(self).score_mod is not PositionalScheme.score_mod


def relative_distance(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """(..., Tq), (..., Tk) -> (..., Tq, Tk) distances i − j (non-negative where causal attention looks)."""
    return q_pos[..., :, None] - k_pos[..., None, :]


def id_lookup(ctx: PositionContext) -> Callable[[Tensor, Tensor], Tensor]:
    """(b, idx) -> the position id of token `idx` in row b, for a `score_mod`: idx itself for the default ids,
    `positions[idx]` for (T,) ids, `positions[b, idx]` for (B, T) ids."""
    if ctx.index is None:
        return lambda b, idx: idx
    ids = ctx.positions
    if ids.dim() == 1:
        return lambda b, idx: ids[idx]
    return lambda b, idx: ids[b, idx]


def batch_bias(bias: Tensor) -> Tensor:
    """A bias (H, Tq, Tk) or (B, H, Tq, Tk) -> 4-D: (1, H, Tq, Tk) for ids shared by every row."""
    return bias if bias.dim() == 4 else bias.unsqueeze(0)


def per_head(table: Tensor) -> Tensor:
    """A per-position table (T, X) or (B, T, X) -> broadcastable against (B, H, T, X): (B, 1, T, X) for (B, T) ids."""
    return table if table.dim() == 2 else table.unsqueeze(-3)
