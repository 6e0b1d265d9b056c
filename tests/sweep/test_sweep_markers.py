"""sweep.markers: a job's state read from disk alone (done only by a marker naming the current checkpoint), and the
failure record the parent loop and the job write alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc_cli.run.journal import commit_checkpoint
from posenc_cli.sweep.markers import DONE_FILE, FAILED_FILE, job_status, mark_done, read_failure, record_failure

META = {"kind": "posenc-run", "schema_version": 1, "steps": 4}


def test_a_job_is_done_only_while_its_marker_names_the_current_checkpoint(tmp_path: Path) -> None:
    job = tmp_path / "train" / "pos=rope"
    assert job_status(job) == "pending"
    commit_checkpoint(job, {"model.safetensors": b"w2"}, {**META, "status": "running", "step": 2})
    assert job_status(job) == "partial"
    with pytest.raises(RuntimeError, match="not 'complete'"):  # a half-trained run is never marked done
        mark_done(job, "pos=rope")
    assert not (job / DONE_FILE).exists()
    commit_checkpoint(job, {"model.safetensors": b"w2"}, {**META, "status": "interrupted", "step": 2})
    assert job_status(job) == "interrupted"
    commit_checkpoint(job, {"model.safetensors": b"w4"}, {**META, "status": "complete", "step": 4})
    mark_done(job, "pos=rope")
    assert job_status(job) == "done"
    assert json.loads((job / DONE_FILE).read_text())["checkpoint"]["step"] == 4
    commit_checkpoint(job, {"model.safetensors": b"w6"}, {**META, "status": "complete", "step": 6, "steps": 6})
    assert job_status(job) == "partial"  # trained further: the marker vouches for another checkpoint


def test_a_failure_record_keeps_its_keys_in_order_and_reads_back(tmp_path: Path) -> None:
    job = tmp_path / "extend" / "pos=rope" / "default"
    job.mkdir(parents=True)
    record_failure(job, "default", "parent run train/pos=rope did not finish")
    assert list(json.loads((job / FAILED_FILE).read_text())) == ["error", "traceback", "job"]
    assert job_status(job) == "failed"
    assert read_failure(job) == "parent run train/pos=rope did not finish"
    (job / FAILED_FILE).write_text("{not json")
    assert read_failure(job) == "unknown error" and read_failure(tmp_path / "nothing") == "unknown error"
