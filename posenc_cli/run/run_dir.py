"""A training run's directory seen from outside the loop: its name, whether a config may continue it, and what it
already holds (a run, posenc's leftovers, or a user's files, which are never overwritten)."""

from __future__ import annotations

import contextlib
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from posenc_cli.config import Config, ModelConfig, config_dir, config_to_dict, flatten
from posenc_cli.errors import CheckpointError, UserError
from posenc_cli.fsutil import atomic_write_text
from posenc_cli.run.layout import CONFIG_FILE, META_FILE, MODEL_FILE, PENDING, STATE_FILE, STATE_JSON
from posenc_cli.run.meta import read_meta

# Keys that may differ when a run is continued: they change speed or logging, not what is learned.
CONTINUATION_KEYS = (
    "train.device", "train.threads", "train.log_every", "train.logger", "train.compile", "eval.", "extend.",
)  # fmt: skip
_OWN_FILES = (MODEL_FILE, STATE_FILE, STATE_JSON, CONFIG_FILE, META_FILE, "tokenizer.json")
# Written first into a directory posenc starts a run in: what such a directory holds before its first checkpoint
# (a .pending/ journal, metrics.jsonl) is then posenc's to finish or remove, never a user's.
CLAIM_FILE = ".posenc-run"
# Names posenc may leave in a directory before it claims it (the lock files, a sweep job's failure record).
_LEFTOVER_NAMES = frozenset({".lock", ".extend.lock", CLAIM_FILE, "failed.json"})


def config_diff(old: Config, new: Config) -> list[str]:
    """'key: old -> new' for every setting that changes what a run learns (runtime-only keys excluded)."""
    a, b = flatten(config_to_dict(old)), flatten(config_to_dict(new))
    diffs = []
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<unset>") != b.get(key, "<unset>") and not key.startswith(CONTINUATION_KEYS):
            diffs.append(f"{key}: {a.get(key, '<unset>')!r} -> {b.get(key, '<unset>')!r}")
    return diffs


def model_preset_name(cfg: Config) -> str:
    """'tiny'/'small'/'base' when the sizes match a preset in configs/model, else e.g. 'd96l3'."""
    m = cfg.model
    defaults = ModelConfig()  # a group file states only what differs from them (run.config_compose)
    with contextlib.suppress(UserError, OSError):
        for path in sorted((config_dir() / "model").glob("*.yaml")):
            stated = yaml.safe_load(path.read_text()) or {}
            preset = {k: stated.get(k, getattr(defaults, k)) for k in ("d_model", "n_layer", "n_head")}
            if (preset["d_model"], preset["n_layer"], preset["n_head"]) == (m.d_model, m.n_layer, m.n_head):
                return path.stem
    return f"d{m.d_model}l{m.n_layer}"


def default_run_dir(cfg: Config, root: Path = Path("outputs/runs")) -> Path:
    """outputs/runs/<timestamp>-<pos>-<model>, with a numeric suffix if that name is taken."""
    base = f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{cfg.pos.name}-{model_preset_name(cfg)}"
    path, n = root / base, 2
    while path.exists():
        path, n = root / f"{base}-{n}", n + 1
    return path


def existing_meta(run_dir: Path) -> dict[str, Any] | None:
    """The committed meta.json of `run_dir`, None for a new run; refuses a directory holding foreign files."""
    if not run_dir.exists():
        return None
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir} exists and is not a directory")
    with contextlib.suppress(CheckpointError):
        if (run_dir / META_FILE).exists() or (run_dir / PENDING / META_FILE).exists():
            return read_meta(run_dir)
    if (run_dir / META_FILE).exists():
        read_meta(run_dir)  # raises the precise error (corrupt meta, wrong kind, ...)
    foreign = [n for n in _OWN_FILES if (run_dir / n).exists()]
    if foreign:
        raise CheckpointError(f"{run_dir} is not a posenc run directory but holds {foreign[0]}; choose another --out")
    check_claimable(run_dir)
    return None


def check_claimable(run_dir: Path) -> None:
    """`CheckpointError` unless `run_dir` (an existing directory without a run) is empty, holds only posenc's
    leftovers, or was claimed by posenc (`CLAIM_FILE`): a user's files are never overwritten or removed."""
    if (run_dir / CLAIM_FILE).is_file():
        return
    others = sorted(p.name for p in run_dir.iterdir() if p.name not in _LEFTOVER_NAMES)
    if others:
        raise CheckpointError(
            f"{run_dir} is not empty and not a posenc run (it holds {others[0]}); choose another --out"
        )


def claim_run_dir(run_dir: Path) -> None:
    """Create `run_dir` and mark it as posenc's (`CLAIM_FILE`) before anything else is written into it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / CLAIM_FILE).is_file():
        atomic_write_text(run_dir / CLAIM_FILE, "a posenc run directory: posenc created it and manages its files\n")
