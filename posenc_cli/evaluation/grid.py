"""Will a retrieval grid fit? `eval-passkey`'s and `eval-tasks`' lengths × depths × trials, refused in one line
before anything is allocated when no memory could hold them (`--lengths 1000000`, `--abs-lengths 1e12`, a huge
`--trials` ended in allocation tracebacks).

The bound is a lower one, so a grid that could run is never refused: the prompts of one length are built at once
(trials × depths rows of int64 ids: `evaluation.passkey.evaluate_passkey_model`, the tasks' likewise), and one
forward holds at least a bf16 hidden state and the bf16 logits of every position of one prompt. It is compared with
`run.memory.available_memory`.
"""

from __future__ import annotations

from typing import Any

from posenc_cli.config import PosConfig
from posenc_cli.errors import ConfigError, UserError
from posenc_cli.evaluation.runs import find_runs
from posenc_cli.positional.layout import LayoutConfig
from posenc_cli.run import memory
from posenc_cli.run.load import read_config
from posenc_cli.run.meta import RunMeta, is_hf_dir, read_meta

__all__ = ["check_grid_fits", "grid_bytes", "position_limit"]

ID_BYTES = 8  # a prompt token id (int64)
MIN_BASE_LENGTH = 2  # a run's base length is at least 2 tokens: the floor of a multiple before any run is read


def grid_bytes(cfg: Any, length: int, d_model: int = 0, vocab: int = 0) -> int:
    """A lower bound on the memory of one length of a retrieval grid: its prompts (built at once) and one forward."""
    prompts = len(cfg.depths) * int(cfg.trials) * length * ID_BYTES
    return prompts + length * 2 * (d_model + vocab)


def check_grid_fits(cfg: Any, paths: list[str] | None = None, available: int | None = None) -> None:
    """One-line `ConfigError` (exit 2, before anything is allocated) for a length or a trial count whose lower-bound
    memory (`grid_bytes`) exceeds the memory available (`run.memory.available_memory`).

    With `paths`, each posenc run is checked with its own base length, width, vocabulary and position limit: a
    length its scheme cannot read is not refused (its cells are n/a, with the scheme's reason, and cost nothing).
    Without them (or for a run that cannot be read cheaply, a transformers directory) only what holds for any run
    is checked: every length asked for, a multiple taken of a base length of at least 2.
    """
    available = memory.available_memory() if available is None else available
    if available is None:
        return
    sizes, unknown = _run_sizes(paths) if paths is not None else ([], True)
    if unknown:
        _refuse_beyond(cfg, _longest(cfg, MIN_BASE_LENGTH), "any run", available)
    for path, base, limit, d_model, vocab in sizes:
        longest = _longest(cfg, base, limit)
        if longest is not None:
            _refuse_beyond(cfg, longest, path, available, d_model, vocab)


def _longest(cfg: Any, base_length: int, limit: int | None = None) -> tuple[int, str] | None:
    """(the longest prompt length of the grid at most `limit`, the flag that asked for it) for runs of
    `base_length`; None when every length is beyond `limit`."""
    if cfg.abs_lengths:
        asked = [(int(n), f"--abs-lengths {int(n)}") for n in cfg.abs_lengths]
    else:
        asked = [(max(1, round(float(m) * base_length)), f"--lengths {float(m):g}") for m in cfg.lengths]
    readable = [a for a in asked if limit is None or a[0] <= limit]
    return max(readable) if readable else None


def _refuse_beyond(
    cfg: Any, longest: tuple[int, str] | None, what: str, available: int, d_model: int = 0, vocab: int = 0
) -> None:
    if longest is None:
        return
    length, flag = longest
    need = grid_bytes(cfg, length, d_model, vocab)
    if need > available:
        floor = "at least " if what == "any run" and not cfg.abs_lengths else ""  # a multiple of an unknown base
        raise ConfigError(
            f"{flag} --trials {cfg.trials}: {floor}{length:,} tokens per prompt for {what}; the {len(cfg.depths)} "
            f"depths × {cfg.trials} trials of one length need at least {_gib(need)} of memory and {_gib(available)} "
            "is available (fewer trials or shorter lengths)"
        )


def _run_sizes(paths: list[str]) -> tuple[list[tuple[str, int, int | None, int, int]], bool]:
    """([(run, base length, position limit, d_model, vocabulary)] of each posenc run below `paths` that can be read
    cheaply, whether some run could not be (a transformers directory, a broken run: the evaluation reports the
    latter in its own words)). The position limit is `position_limit`'s."""
    try:
        runs = find_runs(paths)
    except UserError:
        return [], True
    sizes = []
    unknown = False
    for path in runs:
        try:
            if is_hf_dir(path):
                raise UserError("a transformers directory")
            meta = read_meta(path)
            config = read_config(path, meta)
        except UserError:
            unknown = True
            continue
        base = RunMeta.from_json(meta).lengths(config)[1]
        limit = position_limit(config.pos, config.train.seq_len)
        sizes.append((str(path), base, limit, config.model.d_model, memory.planned_vocab_size(config)))
    return sizes, unknown


def position_limit(pos: PosConfig, seq_len: int) -> int | None:
    """A learned table's size (`pos.table_size`, else the training length), the only scheme with a position limit;
    a per-layer layout's is its learned layers' (a learned table can only be a layout's one scheme); else None."""
    if isinstance(pos, LayoutConfig):
        limits = [lim for e in pos.entries() if (lim := position_limit(e.pos, seq_len)) is not None]
        return min(limits) if limits else None
    if pos.name != "learned":
        return None
    return getattr(pos, "table_size", None) or seq_len


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"
