"""The rows of a training or validation batch, by `train.packing` and `train.loss_on` (`config.TrainConfig`).

- `stream`: windows of seq_len + 1 tokens of the split's token stream (`cache.window_index`).
- `none`: one example per row: its end-of-document token's predecessor opens it at position 0 (as an evaluation
  prompt opens with an end-of-document token), then its tokens and its closing end-of-document token; the rest of
  the row is padding (McGill-NLP/length-generalization 40f8a44, `src/data/s2s_dl_factory.py:335-377`:
  `decoder_only_group_samples: false`, right padding).
- `document`: whole examples laid one after another into a row while they fit (drawn as for `none`), each at
  positions restarting at 0 and with its own document id; the rest of the row is padding (document id -1).

An example is the tokens from one end-of-document token to the next: a row holds it as n inputs ([eod] + the
document) and n targets (the document + [eod]), so an example fits a row of seq_len inputs when n <= seq_len. The
targets a loss counts (`Rows.weights`) are the real ones (not padding) and, under `loss_on=answer`, those the data
source scored (`Corpus.train_scored`). Rows are drawn with the run's sampler generator only (same state => same
rows), so a resumed run draws what an uninterrupted one does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from posenc_cli.data.cache import window_index
from posenc_cli.data.examples import Examples, find_examples
from posenc_cli.errors import ConfigError

__all__ = [
    "Examples",
    "Rows",
    "check_examples_fit",
    "example_rows",
    "find_examples",
    "packed_rows",
    "stream_rows",
]

PAD_DOCUMENT = -1  # the document id of padding: a document of one token (attention lets a pad see only itself)


@dataclass
class Rows:
    """A batch: `tokens` (B, T+1) int64 (x = [:, :-1], y = [:, 1:]); `weights` (B, T) bool, the targets the loss
    counts (None: every target, the stream under `loss_on=all`); `position_ids` and `documents` (B, T) int64 under
    `packing=document` (None otherwise); `real`: input tokens that are not padding (throughput counts these)."""

    tokens: Tensor
    weights: Tensor | None
    position_ids: Tensor | None
    documents: Tensor | None
    real: int

    @property
    def scored(self) -> int:
        """Targets the loss counts."""
        return int(self.weights.sum()) if self.weights is not None else self.tokens[:, 1:].numel()


def check_examples_fit(examples: Examples, seq_len: int, packing: str, split: str) -> None:
    """`ConfigError` (one line) when a split has no example, or its longest example does not fit a row."""
    if examples.ends.size == 0:
        raise ConfigError(f"train.packing={packing}: the {split} split holds no end-of-document token (no example)")
    longest = int(examples.lengths.max())
    if longest > seq_len:
        raise ConfigError(
            f"train.packing={packing}: the longest {split} example is {longest + 1} tokens with the end-of-document "
            f"tokens around it, more than train.seq_len + 1 = {seq_len + 1}; set train.seq_len={longest} or more"
        )


def stream_rows(
    tokens: np.ndarray,
    scored: np.ndarray | None,
    batch_size: int,
    seq_len: int,
    generator: torch.Generator,
    starts: np.ndarray | None,
    answer_only: bool,
) -> Rows:
    """`packing=stream`: `cache.window_index`'s windows, weighted by the scored mask under
    `loss_on=answer` (`scored` None: every token scored)."""
    index = window_index(len(tokens), batch_size, seq_len, generator, starts)  # (B, T+1)
    rows = torch.from_numpy(np.asarray(tokens[index]).astype(np.int64))  # (B, T+1)
    weights = None
    if answer_only and scored is not None:
        weights = torch.from_numpy(np.asarray(scored[index[:, 1:]]).astype(bool))  # (B, T)
    return Rows(rows, weights, None, None, rows.shape[0] * seq_len)


def _lay_out(
    tokens: np.ndarray,
    scored: np.ndarray | None,
    examples: Examples,
    placed: tuple[np.ndarray, np.ndarray, np.ndarray],
    batch_size: int,
    seq_len: int,
    eod_id: int,
    answer_only: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """Rows (B, T+1), weights (B, T), position ids and document ids (B, T) of examples placed at (row, column,
    example): example e fills columns c..c+n-1 of its row with inputs [eod] + document and targets document + [eod]."""
    row, col, pick = placed  # (E,) each
    n = examples.lengths[pick]  # (E,)
    each = np.repeat(np.arange(pick.size), n)  # (N,) the placed example of every placed token
    k = np.arange(each.size) - np.repeat(np.cumsum(n) - n, n)  # (N,) position within its example
    r, c = row[each], col[each] + k  # (N,) row and column of every placed token
    src = examples.starts[pick][each] + k  # (N,) offset of its target in the split
    full = np.full((batch_size, seq_len + 1), eod_id, dtype=np.int64)  # padding: end-of-document ids
    full[r, c + 1] = np.asarray(tokens[src])  # targets; inputs are the same row shifted, [eod] opening each example
    full[r[k == 0], c[k == 0]] = eod_id
    weights = np.zeros((batch_size, seq_len), dtype=bool)
    weights[r, c] = np.asarray(scored[src]).astype(bool) if answer_only and scored is not None else True
    positions = np.zeros((batch_size, seq_len), dtype=np.int64)
    positions[r, c] = k
    documents = np.full((batch_size, seq_len), PAD_DOCUMENT, dtype=np.int64)
    first_in_row = np.r_[0, np.flatnonzero(np.diff(row)) + 1]  # (rows used,) index of each row's first example
    within = np.arange(pick.size) - np.repeat(first_in_row, np.diff(np.r_[first_in_row, pick.size]))  # (E,)
    documents[r, c] = within[each]
    as_tensor = torch.from_numpy
    return as_tensor(full), as_tensor(weights), as_tensor(positions), as_tensor(documents), int(each.size)


def example_rows(
    tokens: np.ndarray,
    scored: np.ndarray | None,
    examples: Examples,
    picks: np.ndarray,
    seq_len: int,
    eod_id: int,
    answer_only: bool,
) -> Rows:
    """`packing=none`: example `picks[b]` in row b from position 0, right-padded (pads: weight 0; after every real
    token, so a causal model's real tokens never attend to them)."""
    picks = np.asarray(picks, dtype=np.int64)
    placed = (np.arange(picks.size), np.zeros(picks.size, dtype=np.int64), picks)
    full, weights, _, _, real = _lay_out(tokens, scored, examples, placed, picks.size, seq_len, eod_id, answer_only)
    return Rows(full, weights, None, None, real)


def draw_examples(examples: Examples, batch_size: int, generator: torch.Generator) -> np.ndarray:
    """`packing=none`'s examples: B uniform draws of the split's examples with `generator`."""
    pick = torch.randint(0, examples.ends.size, (batch_size,), generator=generator, device=generator.device)
    return pick.cpu().numpy().astype(np.int64)


def packed_rows(
    tokens: np.ndarray,
    scored: np.ndarray | None,
    examples: Examples,
    batch_size: int,
    seq_len: int,
    generator: torch.Generator,
    eod_id: int,
    answer_only: bool,
) -> Rows:
    """`packing=document`: examples drawn B at a time with `generator` and laid greedily into rows: one follows the
    last in its row while it fits, else it opens the next row; the example that does not fit the last row and the
    rest of its draw are dropped. Position ids restart at 0 per example; document ids count the examples of a row."""
    lengths = examples.lengths
    rows, cols, picks = [], [], []
    row = used = 0
    while row < batch_size:
        for pick in draw_examples(examples, batch_size, generator).tolist():  # one step per example
            n = int(lengths[pick])
            if used + n > seq_len:
                row, used = row + 1, 0
                if row == batch_size:
                    break
            rows.append(row)
            cols.append(used)
            picks.append(pick)
            used += n
    placed = (np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64), np.array(picks, dtype=np.int64))
    full, weights, positions, documents, real = _lay_out(
        tokens, scored, examples, placed, batch_size, seq_len, eod_id, answer_only
    )
    return Rows(full, weights, positions, documents, real)
