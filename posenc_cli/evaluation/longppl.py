"""LongPPL: perplexity over the key tokens of a long text (Fang et al., "What is Wrong with Perplexity for
Long-context Language Modeling?", ICLR 2025, arXiv 2410.23771; reference code PKU-ML/LongPPL 1decd2a,
`longppl/longppl.py`, `perplexity/run_ppl.sh`).

A token is a key token when the long context makes it much more predictable and it is predicted well: its log-
probability with the long context minus that with a short one (LSD) exceeds α, and its long-context log-probability
(LCL) exceeds β. Defaults α = 2, β = −2 (`find_key_token(..., alpha=2, beta=-2)`, longppl.py:22; the test
`(loss_short - loss_full) > alpha` and `loss_full < -beta`, line 44). LongPPL = exp(mean NLL over the key tokens),
token-weighted over every text (perplexity/perplexity.py:67 weights each text's log-LongPPL by its key tokens).

One evaluator chooses the key tokens, every evaluated run is scored on them. As in the reference
(`find_key_token(text, evaluator_model, ...)`, then `cal_overlap` maps the chosen text onto the evaluated model's
tokens, longppl.py:155-159; `run_ppl.sh` names one `--evaluator-model` for every `--model`), the key tokens of a cell
are found once, by an evaluator run the user names, and stored in the evaluator's run directory (`keys_identity`:
evaluator checkpoint, corpus fingerprint, tokenizer, protocol, stride, length, scored tokens, short context, α, β,
precision). They are the stream indices of the targets (`target_indices`): every run with the evaluator's tokenizer
reads the same windows of the same stream, so an index names the same token for each of them, and each run's LongPPL
is exp(mean of its own long-context NLL over exactly those targets). A run whose tokenizer differs from the
evaluator's is refused in one line (the reference maps by character offsets instead). The evaluator's own row is
scored on its own key tokens.

For "train short, test long" the short context is the evaluator's training length L (`short_context_nll`): a target
whose long context holds no more than L tokens has the same context both ways, so it is never a key token, and a
cell at a length L' <= L has none by construction (`key_tokens` 0, `longppl` None: cannot be measured).

The short context, token by token. A window of the protocol reads inputs u_0..u_{L'-1}; its logits at position p
predict u_{p+1} from the p + 1 tokens u_0..u_p. The candidates are the protocol's scored positions with p + 1 > L.
They are cut, in order, into blocks of `block` positions (default L // 4, `short_block`; the last block may be
shorter); block [p0, p1] is scored by one forward of the evaluator over the L tokens u_{p1+1-L}..u_{p1} at positions
0..L-1 (its training range), whose last p1 - p0 + 1 predictions are the block's. So target p sees the L - (p1 - p)
tokens right before it: between L - block + 1 and L, never more than the training length.

This is the reference's construction (longppl.py:34-42: blocks of `sliding_window` targets share one short forward
over the `trunc_len` tokens before the block plus the block itself) with trunc_len = L - block + 1 and
sliding_window = block, and these deviations, each stated: (1) the reference's short forward is anchored at the
block's start and its short contexts run from trunc_len to trunc_len + sliding_window - 1 tokens; here they end at L,
because the evaluator is a model trained at L and positions past L are what is being tested; the last, shorter
block is anchored at its end (the reference shortens its forward, line 35); (2) the reference's evaluator is a
strong long-context model (Llama-3.1-8B, 4,096-token short context); here it is one of the runs, the best one at
the longest length being the natural choice; (3) the reference's long context is the whole text, here it is the
protocol's window (sliding, fixed-target, nonoverlap), so LongPPL is a metric of each protocol; the streaming
protocol has no evaluator LongPPL; (4) block = L // 4 follows the reference's sliding_window / trunc_len =
1024 / 4096.

An evaluator trained with randomized positions feeds its short windows sorted draws of L ids from its range, as it
was trained, from a generator of their own (`short_generator`, seeded by the cell's seed and L).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from posenc_cli.errors import CheckpointError
from posenc_cli.fsutil import atomic_write_text

if TYPE_CHECKING:
    from posenc_cli.evaluation.positions import Positions

__all__ = [
    "ALPHA",
    "BETA",
    "KEYS_DIR",
    "KEYS_VERSION",
    "KeyTokenSum",
    "KeyTokens",
    "candidate_positions",
    "key_targets",
    "key_token_mask",
    "keys_id",
    "keys_identity",
    "longppl",
    "read_keys",
    "short_block",
    "short_blocks",
    "short_context_nll",
    "short_generator",
    "target_indices",
    "write_keys",
]

ALPHA = 2.0  # LSD threshold, PKU-ML/LongPPL longppl/longppl.py:22
BETA = -2.0  # LCL threshold, same line
BLOCK_DIVISOR = 4  # block = L // 4: the reference's sliding_window / trunc_len = 1024 / 4096 (longppl.py:111-112)
# Version of the key-token choice: part of every stored key set's identity and of the entries scored on it, so a
# change to how key tokens are chosen never reuses sets (or LongPPLs) of the old choice.
KEYS_VERSION = 1
KEYS_DIR = Path("eval") / "longppl_keys"  # in the evaluator's run directory: one JSON file per key set


def key_token_mask(
    logp_long: torch.Tensor, logp_short: torch.Tensor, alpha: float = ALPHA, beta: float = BETA
) -> torch.Tensor:
    """Key tokens, a bool tensor of the inputs' shape: LSD = logp_long − logp_short > α and LCL = logp_long > β."""
    return ((logp_long - logp_short) > alpha) & (logp_long > beta)


def longppl(nll: torch.Tensor, mask: torch.Tensor) -> float | None:
    """exp(mean of `nll` over `mask`); None without a key token (LongPPL cannot be measured)."""
    n = int(mask.sum())
    if n == 0:
        return None
    return math.exp(float(nll[mask].double().sum()) / n)


def short_block(train_length: int) -> int:
    """Targets that share one short forward: L // 4 (at least 1)."""
    return max(1, train_length // BLOCK_DIVISOR)


def candidate_positions(length: int, scored: int, train_length: int) -> tuple[int, int] | None:
    """(first, last) window positions of the scored ones (the last `scored` of `length`) whose long context holds
    more than `train_length` tokens; None when there is none (length <= train_length)."""
    first = max(train_length, length - scored)
    return (first, length - 1) if first <= length - 1 else None


def short_blocks(first: int, last: int, block: int) -> list[tuple[int, int]]:
    """(p0, p1) of each block of positions first..last, inclusive, `block` each and the last shorter."""
    return [(p0, min(p0 + block - 1, last)) for p0 in range(first, last + 1, block)]


@dataclass(frozen=True)
class KeyTokens:
    """How to find a cell's key tokens: the run's training length L, the thresholds and the short block."""

    train_length: int
    alpha: float = ALPHA
    beta: float = BETA
    block: int | None = None  # None: `short_block(train_length)`

    @property
    def block_size(self) -> int:
        return self.block if self.block is not None else short_block(self.train_length)


@dataclass
class KeyTokenSum:
    """Running NLL sum (float64) and count of a cell's key tokens; `result()` gives the entry's two fields."""

    nll: float = 0.0
    count: int = 0

    def add(self, nll_long: torch.Tensor, nll_short: torch.Tensor, settings: KeyTokens) -> None:
        """Add the key tokens among targets with these long- and short-context NLLs (same shape, fp32)."""
        mask = key_token_mask(-nll_long, -nll_short, settings.alpha, settings.beta)
        self.nll += float(nll_long[mask].double().sum())
        self.count += int(mask.sum())

    def add_at(self, nll: torch.Tensor, targets: np.ndarray, keys: np.ndarray) -> None:
        """Add the targets among `targets` (stream indices, `nll`'s shape) that are in `keys` (sorted stream indices
        of the key tokens, `key_targets`'s)."""
        mask = torch.from_numpy(np.isin(targets, keys))
        self.nll += float(nll[mask].double().sum())
        self.count += int(mask.sum())

    def result(self) -> dict[str, Any]:
        """{"longppl": exp(mean key-token NLL) or None without key tokens, "key_tokens": their count}."""
        return {"longppl": math.exp(self.nll / self.count) if self.count else None, "key_tokens": self.count}


def target_indices(starts: np.ndarray, first: int, count: int) -> np.ndarray:
    """Stream indices of the targets at window positions first..first+count-1 of windows starting at `starts`:
    position p of a window at s predicts token s + p + 1. (len(starts), count) int64."""
    return starts[:, None].astype(np.int64) + first + 1 + np.arange(count, dtype=np.int64)


def key_targets(
    nll_long: torch.Tensor, nll_short: torch.Tensor, targets: np.ndarray, alpha: float = ALPHA, beta: float = BETA
) -> np.ndarray:
    """The stream indices among `targets` (same shape as the NLLs) of the key tokens (`key_token_mask`), 1-D int64."""
    mask = key_token_mask(-nll_long, -nll_short, alpha, beta).numpy()
    return np.asarray(targets, dtype=np.int64)[mask]


def keys_identity(
    *,
    evaluator: dict[str, Any],
    data: dict[str, Any],
    tokenizer: str,
    protocol: str,
    stride: int | None,
    length: int,
    tokens: int,
    settings: KeyTokens,
    dtype: str,
    positions: dict[str, Any],
) -> dict[str, Any]:
    """What a key set measured: the evaluator's checkpoint (`results.checkpoint_identity`), the corpus {name,
    fingerprint} and tokenizer fingerprint, the cell's windows (protocol, stride, length, scored tokens), the short
    context (the evaluator's training length and block), α, β, the evaluator's precision and position ids."""
    return {
        "version": KEYS_VERSION,
        "evaluator": {"step": evaluator.get("step"), "model_sha256": evaluator.get("model_sha256")},
        "data": {"name": data.get("name"), "fingerprint": data.get("fingerprint")},
        "tokenizer": tokenizer,
        "protocol": protocol,
        "stride": stride,
        "length": int(length),
        "tokens": int(tokens),
        "short_context": settings.train_length,
        "block": settings.block_size,
        "alpha": settings.alpha,
        "beta": settings.beta,
        "dtype": dtype,
        "positions": positions,
    }


def keys_id(identity: dict[str, Any]) -> str:
    """A key set's name: the first 16 hex digits of the sha256 of its identity (sorted-key JSON)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def read_keys(run_dir: Path, identity: dict[str, Any]) -> np.ndarray | None:
    """The key set stored in the evaluator's run directory for `identity`; None when absent. A file whose identity
    differs from its name's is a CheckpointError."""
    path = Path(run_dir) / KEYS_DIR / f"{keys_id(identity)}.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable key-token file ({e}); delete it to choose the tokens again") from e
    if not isinstance(doc, dict) or doc.get("identity") != identity or not isinstance(doc.get("targets"), list):
        raise CheckpointError(f"{path}: not the key-token set its name says; delete it to choose the tokens again")
    return np.asarray(doc["targets"], dtype=np.int64)


def write_keys(run_dir: Path, identity: dict[str, Any], targets: np.ndarray) -> Path:
    """Store a key set (sorted stream indices of the key tokens) with its identity in the evaluator's directory."""
    path = Path(run_dir) / KEYS_DIR / f"{keys_id(identity)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"identity": identity, "key_tokens": len(targets), "targets": [int(t) for t in targets]}
    atomic_write_text(path, json.dumps(doc) + "\n")
    return path


def short_generator(positions: Positions, train_length: int) -> torch.Generator:
    """The generator of a cell's short windows' position ids, in window order: seeded by (seed, L), apart from
    `Positions.generator`'s."""
    digest = hashlib.sha256(f"posenc-longppl-short-positions:{positions.seed}:{train_length}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)


def short_context_nll(
    model: nn.Module,
    tokens: np.ndarray,
    starts: np.ndarray,
    first: int,
    last: int,
    settings: KeyTokens,
    *,
    batch_tokens: int,
    dtype: str,
    device: torch.device,
    positions: Positions | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """NLL of each window's targets at positions first..last with their short context (see the module docstring),
    (len(starts), last - first + 1) fp32 on the CPU. A window at s reads inputs tokens[s..s+L'-1]; `first` >= L.
    `positions` random feeds each short window a draw of L ids from `generator`."""
    L, block = settings.train_length, settings.block_size
    blocks = short_blocks(first, last, block)
    ends = np.array([p1 for _, p1 in blocks], dtype=np.int64)  # (n_blocks,) last position of each block
    # (n_windows * n_blocks, L+1) stream indices: inputs u_{p1+1-L}..u_{p1} and the next token
    rows = (starts[:, None] + ends[None, :] + 1 - L).reshape(-1, 1) + np.arange(L + 1, dtype=np.int64)
    per_batch = max(1, batch_tokens // L)
    scored = torch.empty(len(rows), block, dtype=torch.float32)  # (rows, block) NLL of each row's last targets
    for i in range(0, len(rows), per_batch):
        batch = torch.from_numpy(np.asarray(tokens[rows[i : i + per_batch]], dtype=np.int64)).to(device)
        x, y = batch[:, :-1], batch[:, -block:]  # (B, L) inputs, (B, block) targets
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            if positions is not None and positions.random and generator is not None:
                logits = model(x, position_ids=positions.draw(len(x), L, generator).to(device))  # (B, L, V)
            else:
                logits = model(x)  # (B, L, V)
        last_logits = logits[:, -block:, :].float()  # (B, block, V): log-softmax in fp32
        loss = F.cross_entropy(last_logits.reshape(-1, last_logits.size(-1)), y.reshape(-1), reduction="none")
        scored[i : i + len(x)] = loss.view(-1, block).cpu()
    scored = scored.view(len(starts), len(blocks), block)  # (n_windows, n_blocks, block)
    pieces = [scored[:, b, block - (p1 - p0 + 1) :] for b, (p0, p1) in enumerate(blocks)]
    return torch.cat(pieces, dim=1)  # (n_windows, last - first + 1)
