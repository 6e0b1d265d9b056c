"""A job's state on disk: its done marker, its failure record, and `job_status`, the one reader of both.

A job is done only by its marker `done.json`, written last and atomically after its training finished (meta status
"complete", not "interrupted") and its evaluation wrote every cell; it names the checkpoint it vouches for, so a job
trained further afterwards is not done any more. A failed job holds `failed.json` (its error and traceback).
"""

from __future__ import annotations

import json
from pathlib import Path

from posenc_cli.errors import CheckpointError
from posenc_cli.evaluation.results import checkpoint_identity
from posenc_cli.fsutil import atomic_write_json
from posenc_cli.run.meta import RunMeta, read_run_meta

FAILED_FILE = "failed.json"
DONE_FILE = "done.json"  # a job's completion marker, written last


def mark_done(job_dir: Path, name: str) -> None:
    """Write the job's done marker (last, atomically), naming the checkpoint its results measured."""
    meta = read_run_meta(job_dir)
    if meta.status != "complete":  # training must have finished; never mark a half-trained run done
        raise RuntimeError(f"{job_dir}: training status is {meta.status!r}, not 'complete'")
    record = {"job": name, "checkpoint": checkpoint_identity(meta)}
    atomic_write_json(job_dir / DONE_FILE, record)


def record_failure(job_dir: Path, name: str, error: str, traceback: str = "") -> None:
    """Write the job's failure record (`FAILED_FILE`): its error line and, for an exception, the traceback."""
    atomic_write_json(job_dir / FAILED_FILE, {"error": error, "traceback": traceback, "job": name})


def job_status(job_dir: Path) -> str:
    """The one definition of a job's state, from disk.

    'done': its marker exists and names the run's current checkpoint (training complete, every cell evaluated);
    'failed': failed.json; 'interrupted': a signal stopped its training (a re-run resumes it); 'partial': started
    but not done (killed, or stopped during evaluation: a re-run finishes it); 'pending': not started.
    """
    job_dir = Path(job_dir)
    try:
        meta: RunMeta | None = read_run_meta(job_dir)
    except (CheckpointError, OSError):
        meta = None
    try:
        marker = json.loads((job_dir / DONE_FILE).read_text())
    except (OSError, ValueError):
        marker = None
    if meta is not None and isinstance(marker, dict) and marker.get("checkpoint") == checkpoint_identity(meta):
        return "done"
    if (job_dir / FAILED_FILE).is_file():
        return "failed"
    if meta is not None and meta.status == "interrupted":
        return "interrupted"
    return "partial" if job_dir.is_dir() and any(job_dir.iterdir()) else "pending"


def read_failure(job_dir: Path) -> str:
    """The error a failed job recorded ("unknown error" when its record cannot be read)."""
    try:
        return str(json.loads((job_dir / FAILED_FILE).read_text()).get("error", "unknown error"))
    except (OSError, ValueError):
        return "unknown error"
