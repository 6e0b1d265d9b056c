"""The interface of an attention temperature (one registry entry per method, `posenc_cli.temperatures`).

An entry is a frozen dataclass of its settings (hashable: a forward builds each distinct entry's table once, and a
layout's layers with equal settings share one), plus, for a learned one, a per-head parameter that the attention
layer owns under `parameter` (checkpoint key `blocks.<i>.attn.<parameter>`). Its factor for query rows is built
in two steps: `table` (the parameter-free part for the whole context, fp32, built once per forward from the position
ids, the token indexes and the evaluation cell's length) and `query_factor` (those rows' part times the parameter),
so the KV cache's new rows [q_start, T) get exactly the full forward's factors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from posenc_cli.config import ModelConfig
from posenc_cli.errors import ConfigError


@dataclass(frozen=True)
class Temperature:
    """Base class of every entry; subclasses set `name`, `paper` and override `table` and/or `query_factor`."""

    name: ClassVar[str]
    paper: ClassVar[str] = ""
    parameter: ClassVar[str | None] = None  # the attention layer's attribute holding the (H,) parameter, if learned

    @classmethod
    def from_model(cls, cfg: ModelConfig) -> Temperature:
        """The entry as `model.attn_scale=<name>` selects it, from the model's settings."""
        raise ConfigError(f"the {cls.name} temperature is not selectable by model.attn_scale")

    def init_parameter(self, n_head: int) -> Tensor | None:
        """The initial (H,) fp32 parameter of a learned entry (None: the entry has none)."""
        return None

    def table(self, positions: Tensor, token_index: Tensor, cell_length: int) -> Tensor | None:
        """The parameter-free part of every query's factor, fp32, query dim second to last: (T, 1) or (B, 1, T, 1)
        (positions (T,) or (B, T) ids, token_index (T,) the order causality uses, cell_length the tokens of the
        evaluation cell the forward belongs to: `PositionContext.cell_tokens`); None: the entry has none."""
        return None

    def query_factor(self, rows: Tensor | None, param: Tensor | None) -> Tensor:
        """fp32 factors of the query rows, broadcastable against q (B, H, T', hd): from `rows`, the table's rows of
        those queries (`table(...)[..., q_start:, :]`), and the parameter (H,) of a learned entry."""
        if rows is None:
            raise NotImplementedError(f"{self.name}: an entry without a table overrides query_factor")
        return rows

    def apply(self, q: Tensor, rows: Tensor | None, param: Tensor | None) -> Tensor:
        """q (B, H, T', hd) times the factors, in q's dtype (the factor is cast first, as Qwen's log-n is)."""
        return q * self.query_factor(rows, param).to(q.dtype)

    def unit_below(self) -> int | None:
        """Queries at token index < this have factor exactly 1 whatever the parameter (the entry's paper leaves
        them as trained); None: no such guarantee (a learned or constant temperature)."""
        return None

    def describe(self) -> str:
        return self.name
