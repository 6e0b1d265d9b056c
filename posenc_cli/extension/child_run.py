"""The output directory of an extension (`extend_run`, `remap_run`): absent, empty, an earlier attempt at the same
extension (reused, resumed or redone), or something else (refused in one line); and the child run committed into it.

A child is the same extension when its meta.json `extend` record equals the new one in every key that changes its
weights or numbers (`IDENTITY_KEYS`); records written before the scaling was nested per method are read in today's
layout (`recorded_extension`). One writer at a time (`writer_lock`); the child is committed as one checkpoint
(`write_scaled_copy`), so a killed writer leaves a directory that is redone, not reported done (`is_complete`).
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from posenc_cli.config import Config, config_to_yaml, nest_scaling_params
from posenc_cli.errors import CheckpointError, ConfigError, UserError
from posenc_cli.extension.identity import differences
from posenc_cli.fsutil import exclusive_or_fail
from posenc_cli.rope_scaling import RopeScalingConfig, params_class
from posenc_cli.run.journal import commit_checkpoint
from posenc_cli.run.layout import CONFIG_FILE, MODEL_FILE
from posenc_cli.run.meta import RunMeta, is_run_dir, read_meta
from posenc_cli.run.run_dir import check_claimable
from posenc_cli.run.verified import read_verified

if typing.TYPE_CHECKING:
    from posenc_cli.run.load import LoadedRun

__all__ = [
    "IDENTITY_KEYS",
    "LOCK_FILE",
    "check_out_dir",
    "check_same_keys",
    "describe_scaling",
    "existing_child",
    "is_complete",
    "recorded_extension",
    "write_scaled_copy",
    "writer_lock",
]

LOCK_FILE = ".extend.lock"  # held by the one `extend` writing an out directory (filelock; the loser changes nothing)
# Keys of the `extend` record that must match for a re-run to reuse (or resume) an existing child.
# Everything that changes the child's weights or numbers: the method and its parameters (LongRoPE's factors
# included), L, the fine-tune (steps, length, lr, warm-up, PoSE), the parent's weights, log-n, the remapping, and
# the LongRoPE search's settings and scored tokens (`longrope_search.search_identity`).
IDENTITY_KEYS = ("method", "scaling", "finetune", "parent_weights_sha256", "logn", "remap", "search")


def describe_scaling(scaling: Any) -> str:
    """'none' or e.g. 'yarn x4 (L=128)'."""
    if scaling is None or scaling.method == "none":
        return "none"
    return f"{scaling.method} x{scaling.factor:g} (L={scaling.original_length})"


def existing_child(out_dir: Path) -> dict[str, Any] | None:
    """meta.json of a posenc run in `out_dir`; None when absent, empty or posenc's unfinished attempt (claimed);
    ConfigError when it holds anything else."""
    if not out_dir.exists():
        return None
    if not out_dir.is_dir():
        raise ConfigError(f"output directory {out_dir} exists and is not a directory")
    if is_run_dir(out_dir):
        return read_meta(out_dir)
    try:
        check_claimable(out_dir)
    except CheckpointError as e:
        raise ConfigError(f"output directory {out_dir} exists and is not empty; choose another --out") from e
    return None


def is_complete(out_dir: Path, meta: dict[str, Any]) -> bool:
    """A copied child is complete when its meta says so and every file it lists is there and verifies (a directory
    holding only meta.json, as a killed or raced writer could leave, is redone, not reported as done)."""
    if meta.get("status") != "complete":
        return False
    try:
        for name in meta["files"]:
            read_verified(out_dir, meta["files"], name)
    except (CheckpointError, OSError):
        return False
    return True


@contextlib.contextmanager
def writer_lock(out_dir: Path) -> Iterator[None]:
    """Hold `out_dir`'s extend lock, or refuse at once: a second `extend` into the same directory changes nothing."""
    message = f"{out_dir} is being written by another posenc extend; nothing was changed"
    with exclusive_or_fail(out_dir / LOCK_FILE, lambda: UserError(message)):
        yield


def check_out_dir(out: Path, record: dict[str, Any], resume: bool) -> dict[str, Any] | None:
    """The meta of this same extension already in `out` (None: nothing there yet); refuses anything else."""
    existing = existing_child(out)
    if existing is not None:
        check_same_keys(out, existing, record, IDENTITY_KEYS)
    elif resume:
        raise CheckpointError(f"{out} holds no extension to resume")
    return existing


def recorded_extension(meta: dict[str, Any]) -> Any:
    """meta.json's `extend` record in today's layout: a `scaling` recorded flat by earlier versions (every method's
    parameters beside `method`) nested as `config.yaml` now holds it, so an old child compares equal to the same
    extension asked again (`config.nest_scaling_params`)."""
    old = meta.get("extend")
    scaling = old.get("scaling") if isinstance(old, dict) else None
    if isinstance(scaling, dict) and "params" not in scaling:
        with contextlib.suppress(ConfigError):  # not a scaling this version knows: it differs, as it is
            scaling = nest_scaling_params(RopeScalingConfig, scaling, "extend.scaling")
    if isinstance(scaling, dict) and isinstance(scaling.get("params"), dict):
        scaling = {**scaling, "params": with_added_params(scaling.get("method"), scaling["params"])}
    return old if scaling is None or not isinstance(old, dict) else {**old, "scaling": scaling}


def with_added_params(method: Any, params: dict[str, Any]) -> dict[str, Any]:
    """A recorded method's `params` with the parameters added to the method since (YaRN's `mscale`, ...) at their
    defaults, which do what was done before they existed; `params` as it is for a method this version lacks."""
    cls = params_class(method) if isinstance(method, str) else None
    if cls is None:
        return params
    return {**cls().values(), **params}


def check_same_keys(out_dir: Path, meta: dict[str, Any], record: dict[str, Any], keys: Sequence[str]) -> None:
    """Refuse, in one line naming what differs, a child (`meta`) whose extension record differs from `record` in
    `keys` (the LongRoPE search checks its own part before searching)."""
    old = recorded_extension(meta)
    if not isinstance(old, dict):
        raise ConfigError(
            f"output directory {out_dir} already holds a run that is not an extension; choose another --out"
        )
    diffs = [k for k in keys if old.get(k) != record.get(k)]
    if diffs:
        what = "parent weights" if diffs == ["parent_weights_sha256"] else "; ".join(differences(old, record, keys))
        raise ConfigError(
            f"output directory {out_dir} already holds a different extension (other {what}); choose another --out"
        )


def write_scaled_copy(
    parent: LoadedRun, out: Path, child_cfg: Config, extra: dict[str, Any], train_length: int
) -> None:
    """Commit config + byte-identical weights (+ tokenizer file) + meta as one checkpoint (see checkpoint.py)."""
    files = {
        MODEL_FILE: read_verified(parent.path, parent.meta.files, MODEL_FILE),  # checked against the parent's sha256
        CONFIG_FILE: config_to_yaml(child_cfg).encode(),
    }
    if "tokenizer.json" in parent.meta.files:
        files["tokenizer.json"] = read_verified(parent.path, parent.meta.files, "tokenizer.json")
    now = datetime.now(UTC).isoformat(timespec="seconds")
    meta = RunMeta.scaled_copy(parent.meta, train_length=train_length, extra=extra, now=now)
    commit_checkpoint(out, files, meta)
