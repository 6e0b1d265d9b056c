"""metrics.jsonl (posenc_cli/run/metrics.py): a full disk names the log, as every other write does."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from posenc_cli.errors import disk_error_message, is_disk_error
from posenc_cli.run.metrics import MetricsLog, read_metrics


class FullDisk:
    """A text file whose flush fails as a full disk does: ENOSPC and no file name."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def fileno(self) -> int:
        return 0

    def close(self) -> None:
        pass


def test_append_and_read_back(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "run" / "metrics.jsonl")
    log.append({"step": 1, "loss": 2.0})
    log.append({"step": 2, "loss": float("nan")})
    log.close()
    assert read_metrics(tmp_path / "run" / "metrics.jsonl") == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": None}]


@pytest.mark.parametrize("call", ["append", "flush"])
def test_a_full_disk_names_the_metrics_file(tmp_path: Path, call: str) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    log._file = FullDisk()  # type: ignore[assignment]
    with pytest.raises(OSError) as caught:
        log.append({"step": 1}) if call == "append" else log.flush(durable=True)
    assert is_disk_error(caught.value)
    assert disk_error_message(caught.value) == f"{path}: No space left on device"
