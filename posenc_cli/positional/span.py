"""Which keys a query may attend to besides causality: the attention span of one layer.

- `full`: every earlier key (the default; what every layer of a plain model does).
- `sliding` W: the W most recent keys, the query's own included: key j is visible to query i when i − W < j
  (`transformers` `masking_utils.sliding_window_overlay`: `kv_idx > q_idx - sliding_window`; Mistral, Gemma 2/3,
  Qwen2's `use_sliding_window`, Cohere Command A's local layers).
- `chunked` C: keys in the query's own block of C tokens: key j is visible to query i when ⌊i/C⌋ = ⌊j/C⌋
  (`masking_utils.chunked_overlay`; Llama 4's `attention_chunk_size` on its RoPE layers).

Spans follow token order (token indexes 0..T−1), as the causal mask does, never the position ids: `transformers`
builds both masks from cache positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

SpanKind = Literal["full", "sliding", "chunked"]
SPAN_KINDS: tuple[SpanKind, ...] = ("full", "sliding", "chunked")


@dataclass(frozen=True)
class Span:
    """A layer's attention span: `kind` and its size (W for sliding, C for chunked; 0 for full)."""

    kind: SpanKind = "full"
    size: int = 0

    def __post_init__(self) -> None:
        if self.kind not in SPAN_KINDS:
            raise ValueError(f"unknown span {self.kind!r} (one of {', '.join(SPAN_KINDS)})")
        if (self.kind == "full") != (self.size == 0) or self.size < 0:
            raise ValueError(f"a {self.kind} span needs size {'0' if self.kind == 'full' else '> 0'}, got {self.size}")

    @property
    def is_full(self) -> bool:
        return self.kind == "full"

    def covers(self, length: int) -> bool:
        """Whether, for causal attention over `length` tokens, this span hides nothing (it acts as `full`)."""
        return self.is_full or length <= self.size

    def visible(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """(..., Tq), (..., Tk) token indexes -> bool (..., Tq, Tk), True where the span lets query i see key j
        (causality apart); None for `full` (nothing hidden). Packed rows pass each token's index within its
        document, (B, Tq) and (B, Tk), so chunks start at every document's first token."""
        if self.kind == "sliding":
            return k_pos[..., None, :] > q_pos[..., :, None] - self.size
        if self.kind == "chunked":
            return (
                torch.div(k_pos, self.size, rounding_mode="floor")[..., None, :]
                == torch.div(q_pos, self.size, rounding_mode="floor")[..., :, None]
            )
        return None

    def first_key(self, first_query: int, aligned: bool = True) -> int:
        """The smallest key index any query at or after `first_query` can see (causal): the keys before it are
        hidden from every such query, so a kernel need not score them. `aligned=False`: chunks may start anywhere
        (packed rows: at each document's first token), so only the C − 1 keys before a query are certain."""
        if self.kind == "sliding" or (self.kind == "chunked" and not aligned):
            return max(0, first_query - self.size + 1)
        if self.kind == "chunked":
            return first_query // self.size * self.size
        return 0

    def queries_per_chunk(self, budget_elems: int) -> int:
        """Queries per chunk so that a chunk's scores against the keys it can see, n·(n + size) values, stay within
        `budget_elems` (at least 1)."""
        s = self.size
        n = (-s + math.sqrt(s * s + 4 * budget_elems)) / 2  # n² + s·n = budget
        return max(1, int(n))

    def describe(self) -> str:
        return "full" if self.is_full else f"{self.kind} {self.size}"


FULL = Span()
