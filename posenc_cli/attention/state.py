"""What the attention layers of one forward share: the scheme, its position context, and what is built once.

`GPT.forward` makes one `AttentionState` per forward and hands it to every layer. It replaces the string keys the
attention code used to keep in `PositionContext.tables` (which stays the schemes' own): every cached tensor is a
typed field, filled the first time a layer asks for it, and the kernels chosen for this forward are kept beside
them (`kernels`, filled by `choose.forward_kernel`), so the choice runs once per distinct `KernelSpec`.

`Kernel`, the interface every road implements, is declared here beside the state it is called with: the roads
(`kernels`, `windowed`, `scored`, `flex`) import both, and the choice (`choose`) imports the roads, so the modules
import one way: spec < state < roads < choose < layer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch
from torch import Tensor

from posenc_cli.attention.spec import KernelSpec
from posenc_cli.positional.base import PositionalScheme, PositionContext
from posenc_cli.positional.span import Span
from posenc_cli.temperatures import Temperature

MaskKey = tuple[torch.dtype, bool, int]  # (dtype, causal, T) of a folded bias + causal mask


class Kernel(ABC):
    """One attention road: q (B, H, T − q_start, hd), k, v (B, H, T, hd) -> (B, H, T − q_start, hd) for the scheme
    of `state` (q_start = 0 but for the KV cache's kernels)."""

    @abstractmethod
    def __call__(self, q: Tensor, k: Tensor, v: Tensor, state: AttentionState, layer: int) -> Tensor: ...


@dataclass(eq=False)
class AttentionState:
    """Per-forward attention state: `scheme` and `ctx` as the layers receive them, and lazily built tables.

    masks: a bias shared by every layer (`bias_shared_across_layers`) folded with the causal mask, per
        (dtype, causal, T). The other tables are built by their accessors, once per forward. In packed rows
        (`ctx.documents`) the temperatures' tables read each token's index within its document.
    """

    scheme: PositionalScheme
    ctx: PositionContext
    masks: dict[MaskKey, Tensor] = field(default_factory=dict)
    _key_bias: Tensor | None = None
    _key_bias_done: bool = False
    _min_id: int | None = None
    _temperature_tables: dict[Temperature, Tensor | None] = field(default_factory=dict)
    kernels: dict[KernelSpec, Kernel] = field(default_factory=dict)
    _document_masks: dict[bool, Tensor] = field(default_factory=dict)
    _document_starts: list[int] | None = None
    # packed rows: FlexAttention's block mask per (causal, span), built once per forward (`flex.Flex`)
    flex_masks: dict[tuple[bool, Span], object] = field(default_factory=dict)
    # per layer, its trained sink logits (H,) for this forward (`options.attn_sinks`; `choose.attend` sets them)
    sinks: dict[int, Tensor] = field(default_factory=dict)

    def key_bias(self) -> Tensor:
        """The scheme's `key_bias` (H, T) or (B, H, T) at this forward's token indexes, computed once (all layers
        share it). Only asked for when the scheme `offers_key_bias`."""
        if not self._key_bias_done:
            self._key_bias = self.scheme.key_bias(self.ctx.token_index, self.ctx)
            self._key_bias_done = True
        if self._key_bias is None:
            raise ValueError(f"scheme '{self.scheme.name}' offers key_bias but its key_bias hook returned None")
        return self._key_bias

    def document_mask(self, causal: bool) -> Tensor:
        """Packed rows: bool (B, 1, T, T), True where query i may see key j (the same document and, causal, j ≤ i),
        built once per forward for every layer (`kernels.attend_documents` for rows of at most its chunk)."""
        if causal not in self._document_masks:
            docs, pos = self.ctx.documents, self.ctx.token_index
            if docs is None:
                raise ValueError("a document mask needs packed rows (PositionContext.documents)")
            seen = docs.visible(pos, pos)  # (B, 1, T, T)
            self._document_masks[causal] = seen & (pos[None, :] <= pos[:, None]) if causal else seen
        return self._document_masks[causal]

    def document_starts(self) -> list[int]:
        """Packed rows: per token index t, the earliest first token over the rows of the document holding token t
        (keys before it are in earlier documents for every row), one host sync per forward."""
        if self._document_starts is None:
            docs = self.ctx.documents
            if docs is None:
                raise ValueError("document starts need packed rows (PositionContext.documents)")
            self._document_starts = (self.ctx.token_index - docs.local).amin(0).tolist()  # (T,)
        return self._document_starts

    def min_id(self) -> int:
        """The smallest position id (one host sync per forward, shared by the layers)."""
        if self._min_id is None:
            self._min_id = int(self.ctx.positions.min())
        return self._min_id

    def temperature_rows(self, temperature: Temperature, q_start: int = 0) -> Tensor | None:
        """The rows [q_start, T) of `temperature`'s table (`Temperature.table`: (T, 1) or (B, 1, T, 1) fp32, None
        for an entry without one), built once per forward for every layer with equal settings."""
        if temperature not in self._temperature_tables:
            ctx = self.ctx
            docs = ctx.documents
            if docs is None and not isinstance(ctx.cell_length, tuple):
                table = temperature.table(ctx.positions, ctx.token_index, ctx.cell_tokens)
            else:  # packed or padded rows, or a cell per row: row by row
                cells = ctx.cell_length if isinstance(ctx.cell_length, tuple) else None
                B = docs.local.shape[0] if docs is not None else len(cells or ())
                local = docs.local if docs is not None else ctx.token_index.expand(B, -1)  # (B, T)
                table = document_table(temperature, ctx.positions, local, ctx.row_cells(B))
            self._temperature_tables[temperature] = table
        table = self._temperature_tables[temperature]
        return None if table is None else table[..., q_start:, :]


def document_table(temperature: Temperature, positions: Tensor, local: Tensor, cells: tuple[int, ...]) -> Tensor | None:
    """`temperature`'s table for packed or left-padded rows: row by row, each token's index within its document
    (local (B, T)) as its token index, so a query's factor is the one it would get alone from position 0, and the
    row's evaluation cell (`cells`, one per row: `PositionContext.row_cells`, the row's T unless given) ->
    (B, 1, T, 1) fp32."""
    rows = []
    for b in range(local.shape[0]):
        ids = positions[b] if positions.dim() == 2 else positions
        table = temperature.table(ids, local[b], cells[b])  # (T, 1)
        if table is None:
            return None
        rows.append(table.reshape(local.shape[1], 1))
    return torch.stack(rows)[:, None]  # (B, 1, T, 1)
