"""The key/value cache of incremental decoding: each layer's keys *before* the scheme rotates them, and its values.

`GPT.forward(idx, cache=cache)` reads only the new tokens idx (B, Tq): each layer projects them, appends their
k and v here, then lets the scheme rotate the whole key set (cached + new) and the new query rows alone
(`PositionalScheme.rotate_rows`) at the positions of this forward, and attends from the new rows only (the rows
kernels of `posenc_cli.attention`). Keeping keys unrotated is what makes one cache serve every scheme exactly:

- RoPE and its scalings, p-RoPE: a key's rotation depends on its position id alone, so the cache also keeps each
  layer's rotated keys and a forward rotates only its new rows (`rotated_keys`, the scheme's `fixed_key_rotation`),
  except under a length-dependent scaling (dynamic NTK, LongRoPE's short/long switch) and after `evict`
  re-positions the tokens: then every key is rotated again at this forward's positions and frequencies, the table
  the full forward at that length would use. Other rotating schemes (xPos, ...) rotate every key again each time.
- The bias schemes (ALiBi, T5, KERPLE, FIRE, Sandwich, CoPE): the new query rows are one query chunk of the
  existing chunked bias path, against all cached keys; CoPE's gates read q·k of exactly those keys.
- The remaps (Self-Extend, ReRoPE) rotate the whole key set a second time, as in the full forward.

It is also StreamingLLM's cache (Xiao et al. 2023; mit-han-lab/streaming-llm `streaming_llm/kv_cache.py`
`StartRecentKVCache`, `pos_shift/modify_llama.py:89-102`): `evict` keeps the attention sinks and the most recent
tokens, with their K/V as first computed, and the kept tokens take the positions 0..n−1 of their place in the cache
(keys are stored unrotated and rotated at their in-cache positions; the query sits at the cache's end).

Position ids: by default (`ids` None) a cached token's id is its index in the cache, and the new tokens continue
from there. A forward given explicit `position_ids` stores every token's id, and later forwards must give theirs.

Documents (`documents`, the padding of training's `train.packing=none`: −1 is a pad, `positional.base.Documents`):
a batch of prompts of different lengths is left-padded and decoded at once. The cache keeps every token's document id
beside its K/V, so each forward's context rebuilds the documents of all Tc + Tq tokens: a row's ids restart at 0 at
its first real token, a pad attends only to itself and no real token attends to a pad, on every road (the full
forward's and the new rows' alike), and the content-dependent schemes keep pads out of their gates and sums as in
training. New tokens without document ids continue their row's last document (`documents_with`).

The evaluation cell: a cell-level temperature (DroPE's β, `temperatures.drope`) reads the cell's length, which the
cache holds (`cell_length`: given to `GPT.new_cache`, else its first forward's length) and hands to every forward,
so a decoding step of one token is scored as a token of that cell, as the full forward given that length scores it.

One exception to exactness: dynamic NTK scaling beyond the original length. Its frequencies follow each forward's
total length Tc + Tq (`PositionContext.length`), and since keys are cached unrotated, every cached key is rotated
again at the current frequencies, as the full forward rotates them. What the cache cannot redo is everything
computed *from* the earlier rotations: a cached token's K and V in layer 2 and up come from its hidden state, which
attended in the layers below with the frequencies of the step that read it (a shorter total length, smaller
factors). The full forward at length T recomputes those hidden states at T's frequencies; the cache keeps them.
(`transformers` caches keys after rotation, so there the cached keys keep their own step's frequencies too.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["KVCache"]


class KVCache:
    """Per-layer unrotated keys and values (B, H, Tc, hd) of the Tc tokens read so far, and their position ids.

    Each is a view of a buffer with room for the cell (`_extend`): a decoding step writes its own rows, as
    `transformers`' static cache does, instead of copying every held row into a new tensor."""

    def __init__(self, n_layer: int, cell_length: int | tuple[int, ...] | None = None, room: int | None = None) -> None:
        self.keys: list[Tensor | None] = [None] * n_layer
        self.values: list[Tensor | None] = [None] * n_layer
        self.ids: Tensor | None = None  # (Tc,) or (B, Tc) int64 ids; None: each token's index in the cache
        self.documents: Tensor | None = None  # (B, Tc) int64 document ids (−1: a pad); None: one sequence per row
        # per layer, the scheme's `content` features (B, H, Tc, F) of the cached tokens (None: the scheme has none)
        self.content: list[Tensor | None] = [None] * n_layer
        # the evaluation cell's tokens, or one per row (`cell`); None until given or first read
        self.cell_length: int | tuple[int, ...] | None = cell_length
        # tokens per row the buffers are sized for (`_extend`); None: the cell's (the longest row's)
        self.room = max(cell_length) if room is None and isinstance(cell_length, tuple) else room
        # per layer, the keys as the scheme rotated them, for a scheme with `fixed_key_rotation` (`rotated_keys`)
        self.rotated: list[Tensor | None] = [None] * n_layer
        self._buffers: dict[tuple[str, int], Tensor] = {}  # each list's tensors are views of these (`_extend`)
        # a token-mixing model option's last inputs, by (layer, name) (`history`: Canon's K − 1 rows)
        self.histories: dict[tuple[int, str], Tensor] = {}

    def cell(self, given: int | tuple[int, ...] | None, length: int) -> int | tuple[int, ...]:
        """The evaluation cell's length (or one per row) for a forward over `length` tokens (cached + new): the one
        this cache holds, else `given`, else (its first forward) `length`; fixed from then on, so every decoding step
        reads the same cell. ValueError for a `given` other than the one held."""
        if self.cell_length is None:
            self.cell_length = length if given is None else given
        elif given is not None and given != self.cell_length:
            raise ValueError(f"this cache decodes a cell of {self.cell_length} tokens, not {given}")
        return self.cell_length

    def documents_with(self, new: Tensor | None, Tq: int) -> Tensor | None:
        """The document ids (B, Tc + Tq) of a forward reading Tq new tokens: the cached ones (none held: one
        document, 0, per row) followed by `new` (B, Tq), or, when `new` is None, by each row's last document id
        continued; None while neither this forward nor an earlier one gave documents. ValueError when a row to be
        continued ends in a pad (a pad is a document of its own)."""
        held = self.documents
        if new is None:
            if held is None:
                return None
            last = held[:, -1:]  # (B, 1)
            if bool((last < 0).any()):
                raise ValueError("a row of the cache ends in a pad: give the new tokens' documents")
            return torch.cat([held, last.expand(-1, Tq)], dim=1)  # (B, Tc + Tq)
        if held is None:
            held = new.new_zeros(new.shape[0], self.length)  # (B, Tc) the tokens read so far: one document
        return torch.cat([held, new], dim=1)  # (B, Tc + Tq)

    @property
    def length(self) -> int:
        """Tc, the number of cached tokens (those of every layer once a forward has completed)."""
        k = self.keys[-1]
        return 0 if k is None else int(k.shape[2])

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new tokens' k, v (B, H, Tq, hd) to `layer`; returns the layer's full k, v (B, H, Tc + Tq, hd)."""
        self.keys[layer] = k = self._extend(("k", layer), self.keys[layer], k)  # (B, H, Tc + Tq, hd)
        self.values[layer] = v = self._extend(("v", layer), self.values[layer], v)
        return k, v

    def _extend(self, name: tuple[str, int], held: Tensor | None, new: Tensor) -> Tensor:
        """`held` (B, H, Tc, F) followed by `new` (B, H, Tq, F) along the tokens, as a view of a buffer with room to
        spare (`room`, else the cell's length, else twice the tokens), so a step copies its new rows only, not the Tc
        held ones (a fresh buffer, with `held` copied in, when it is full or `held` no longer lives in it: `evict`)."""
        n = 0 if held is None else held.shape[2]
        need = n + new.shape[2]
        buffer = self._buffers.get(name)
        if buffer is None or need > buffer.shape[2] or held is None or held.data_ptr() != buffer.data_ptr():
            held_for = self.room if self.room is not None else self.cell_length
            room = max(need, held_for if isinstance(held_for, int) else 0, 2 * n)
            buffer = new.new_empty(*new.shape[:2], room, new.shape[3])  # (B, H, room, F)
            if held is not None:
                buffer[:, :, :n] = held
            self._buffers[name] = buffer
        buffer[:, :, n:need] = new
        return buffer[:, :, :need]  # (B, H, Tc + Tq, F)

    def append_content(self, layer: int, features: Tensor) -> Tensor:
        """Add the new tokens' `content` features (B, H, Tq, F) to `layer`; returns all (B, H, Tc + Tq, F)."""
        self.content[layer] = features = self._extend(("content", layer), self.content[layer], features)
        return features  # (B, H, Tc + Tq, F)

    def history(self, key: tuple[int, str], x: Tensor, rows: int) -> Tensor:
        """x (B, Tq, C), the new tokens' inputs of a causal token mixer (a Canon layer, `options.canon`) -> (B, rows +
        Tq, C): the `rows` inputs before them (zeros before the first token), then x; the last `rows` are kept for
        the next forward. `evict` leaves them (they are the most recent tokens', as StreamingLLM keeps them)."""
        held = self.histories.get(key)
        if held is None:
            held = x.new_zeros(x.shape[0], rows, x.shape[2])  # (B, rows, C)
        out = torch.cat([held, x], dim=1)  # (B, rows + Tq, C)
        self.histories[key] = out[:, out.shape[1] - rows :]
        return out

    def rotated_keys(
        self, layer: int, scheme: Any, q: Tensor, k: Tensor, ctx: Any, q_start: int
    ) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, hd) and every unrotated key k (B, H, q_start + Tq, hd) of `layer` -> q and k rotated, for a
        `PositionalScheme` with `fixed_key_rotation` and its prepared context (typed Any: positional/ is a layer
        above): the keys rotated at earlier forwards are kept, so only the new rows turn (`rotate_new`); all of them
        on the first forward, or after `evict` re-positioned the cache."""
        old = self.rotated[layer]
        if old is not None and old.shape[2] == q_start:
            q, new = scheme.rotate_new(q, k[:, :, q_start:], ctx, q_start)  # (B, H, Tq, hd) each
            k = self._extend(("rotated", layer), old, new)  # (B, H, q_start + Tq, hd)
        else:
            q, k = scheme.rotate_rows(q, k, ctx, q_start) if q_start else scheme.rotate(q, k, ctx)
            k = self._extend(("rotated", layer), None, k)
        self.rotated[layer] = k
        return q, k

    def evict(self, keep: Tensor | list[int] | range) -> None:
        """Keep only the cached tokens at indexes `keep` (in cache order), dropping the rest from every layer.

        The kept tokens' K/V stay as they were computed; their positions become their new indexes 0..n−1 in the
        cache (StreamingLLM's position shift), so `ids` returns to the default.
        """
        if self.keys[0] is None:
            return
        index = torch.as_tensor(list(keep) if isinstance(keep, range) else keep, dtype=torch.long)
        index = index.to(self.keys[0].device)
        self.keys = [None if k is None else k.index_select(2, index) for k in self.keys]
        self.values = [None if v is None else v.index_select(2, index) for v in self.values]
        self.content = [None if c is None else c.index_select(2, index) for c in self.content]
        self.documents = None if self.documents is None else self.documents.index_select(1, index)
        self.rotated = [None] * len(self.rotated)  # the kept keys take new positions: rotated again next forward
        self._buffers = {}
        self.ids = None

    def keep_sinks_and_recent(self, sinks: int, recent: int) -> None:
        """StreamingLLM's `StartRecentKVCache`: keep the first `sinks` and the last `recent` tokens (no-op while
        the cache holds at most sinks + recent)."""
        n = self.length
        if n <= sinks + recent:
            return
        self.evict([*range(sinks), *range(n - recent, n)])
