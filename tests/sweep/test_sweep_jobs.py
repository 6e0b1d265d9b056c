"""The sweep's job function on its own: each job's log label, and a failure whose record cannot be written."""

from __future__ import annotations

import errno
import io
from pathlib import Path

import pytest

from posenc_cli.run.config_compose import compose_dict
from posenc_cli.sweep import job, joblog, markers
from posenc_cli.sweep.hydra_bridge import JobInfo

pytestmark = pytest.mark.integration  # end to end (sweeps, launchers, DDP, compile): not in the fast lane


@pytest.mark.parametrize(
    ("job_dir", "overrides", "action", "label"),
    [
        ("train/pos=alibi,train.seed=1", ("pos=alibi", "train.seed=1"), "train", "[pos=alibi seed=1]"),
        (
            "extend/pos=rope/extend.finetune_steps=60",
            ("extend.finetune_steps=60",),
            "extend",
            "[extend pos=rope finetune_steps=60]",
        ),
        ("train/default", (), "train", "[train/default]"),  # nothing swept: the job's directory
    ],
)
def test_log_label_names_the_job_by_its_own_overrides(
    tmp_path: Path, job_dir: str, overrides: tuple[str, ...], action: str, label: str
) -> None:
    info = JobInfo(output_dir=tmp_path / job_dir, name=",".join(overrides), overrides=overrides)
    assert joblog.log_label(info, action, tmp_path) == label


def test_every_line_of_a_jobs_log_starts_with_its_label() -> None:
    sink = io.StringIO()
    stream = joblog.Prefixed(sink, "[pos=rope] ")
    stream.write("step 1")
    stream.write(" done\nstep 2\n\nstep")
    stream.write(" 3\n")
    assert sink.getvalue() == "[pos=rope] step 1 done\n[pos=rope] step 2\n[pos=rope] \n[pos=rope] step 3\n"


def test_a_failure_whose_record_cannot_be_written_still_reports_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a full disk failed.json cannot be written either: the job's reason goes to its stderr, the job returns."""

    def full_disk(path: Path, obj: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(markers, "atomic_write_json", full_disk)
    raw = compose_dict(["data=text", "data.paths=[missing]", "train.device=cpu", "train.threads=1"])
    info = JobInfo(output_dir=tmp_path / "train" / "default", name="", overrides=())
    result = job.run_job(raw, info)
    assert result["status"] == "failed" and "missing" in result["error"]
    err = capsys.readouterr().err
    assert "failed: " in err and "missing" in err and "failed.json could not be written" in err
    assert "No space left on device" in err
