"""A job planned with exactly the config of a finished job of an earlier stage is that run: copy it, do not retrain.

The usual case is a select stage's winner: the grid trains each scheme's learning rates on seed 0, and the stage
after it trains seeds 0, 1, 2 with the pick, so seed 0 would train the same bits again (training is deterministic
for a config on one machine: `sweep.identity` leaves out only runtime keys such as the thread count). The copy is
made in a sibling directory and moved into place, and its done marker is written last, as a job's own is; a
`reused.json` in it names the job it was copied from.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from posenc_cli.fsutil import atomic_write_json
from posenc_cli.sweep.identity import identity_hash
from posenc_cli.sweep.markers import DONE_FILE, job_status, mark_done

REUSED_FILE = "reused.json"  # in a copied job's directory: the job it was copied from
NOT_COPIED = {".lock", DONE_FILE, REUSED_FILE}  # a job's lock and markers are its own


class PlannedJob(Protocol):
    """What reuse needs of a planned job (`sweep.plan.Job`)."""

    action: str
    name: str

    @property
    def key(self) -> str: ...

    @property
    def resolved(self) -> bool: ...

    def dir(self, sweep_dir: Path) -> Path: ...


def work(action: str) -> str:
    """What a job of `action` does: a select stage's jobs train as train jobs do."""
    return "train" if action == "select" else action


def finished_by_identity(
    jobs: list[PlannedJob], identities: dict[str, dict[str, Any]], sweep_dir: Path
) -> dict[tuple[str, str], PlannedJob]:
    """(work, identity hash) -> the first done job of `jobs` with it."""
    found: dict[tuple[str, str], PlannedJob] = {}
    for job in jobs:
        if job.resolved and job.key in identities and job_status(job.dir(sweep_dir)) == "done":
            found.setdefault((work(job.action), identity_hash(identities[job.key])), job)
    return found


def reuse_identical(
    jobs: list[PlannedJob],
    earlier: list[PlannedJob],
    identities: dict[str, dict[str, Any]],
    sweep_dir: Path,
    say: Callable[[str, str], None],
) -> list[str]:
    """Copy into each pending job of `jobs` the done job of `earlier` that did the same work (`work`) with the same
    identity; returns the keys of the jobs copied."""
    finished = finished_by_identity(earlier, identities, sweep_dir)
    copied = []
    for job in jobs:
        if not job.resolved or job.key not in identities:
            continue
        target = job.dir(sweep_dir)
        source = finished.get((work(job.action), identity_hash(identities[job.key])))
        if source is None or job_status(target) != "pending":
            continue
        copy_run(source.dir(sweep_dir), target, job.name, source.key)
        copied.append(job.key)
        say("reuse", f"{job.key}: the same config as {source.key}, which is done: copied, not trained again")
    return copied


def copy_run(source: Path, target: Path, name: str, source_key: str) -> None:
    """Copy a done job's directory to `target` (absent or empty), then write its provenance and, last, its marker."""
    staging = target.parent / f".{target.name}.copy-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copytree(source, staging, ignore=lambda _dir, names: [n for n in names if n in NOT_COPIED])
        if target.is_dir():
            target.rmdir()  # pending: empty (an OSError here means it is not, and nothing was replaced)
        os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    atomic_write_json(target / REUSED_FILE, {"copied_from": source_key})
    mark_done(target, name)
