"""Atomic writes: the old file survives a failed write; a finished one gets the usual permissions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from posenc_cli.cli.app import split_args
from posenc_cli.fsutil import atomic_path, atomic_write_json, atomic_write_text


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "results.json"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_written_files_get_the_umask_mode_not_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "a.json", {"x": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644


def test_existing_paths_with_equals_signs_are_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pos=rope").mkdir()
    assert split_args(["pos=rope", "pos=alibi", "run"]) == (["pos=rope", "run"], ["pos=alibi"])


# -- storage errors name the file being written -------------------------------------------------------------------


def test_a_full_disk_inside_an_atomic_write_names_the_target(tmp_path: Path) -> None:
    import errno

    target = tmp_path / "train.bin"
    with pytest.raises(OSError) as info, atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")  # what os.write raises: no file name
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    assert [p.name for p in tmp_path.iterdir()] == []


def test_a_short_write_without_errno_becomes_enospc_naming_the_target(tmp_path: Path) -> None:
    import errno

    target = tmp_path / "val.bin"
    with pytest.raises(OSError) as info, atomic_path(target):
        raise OSError("4096 requested and 1024 written")  # numpy's tofile on a full disk
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    assert "short write" in info.value.strerror


def test_other_errors_pass_through_unchanged(tmp_path: Path) -> None:
    err = OSError(2, "No such file", "/elsewhere")
    with pytest.raises(OSError) as info, atomic_path(tmp_path / "x"):
        raise err
    assert info.value is err


def test_write_all_refuses_a_short_write(tmp_path: Path) -> None:
    import errno

    import numpy as np

    from posenc_cli.fsutil import write_all

    class Short:
        name = str(tmp_path / "f")

        def write(self, data: memoryview) -> int:
            return len(data) // 2

    with pytest.raises(OSError) as info:
        write_all(Short(), np.arange(10, dtype=np.uint16))
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "f")
    with open(tmp_path / "g", "wb") as f:
        write_all(f, np.arange(10, dtype=np.uint16))
    assert np.array_equal(np.fromfile(tmp_path / "g", dtype=np.uint16), np.arange(10))


def test_make_temp_dir_has_mkdirs_mode(tmp_path: Path) -> None:
    from posenc_cli.fsutil import make_temp_dir

    old = os.umask(0o027)
    try:
        a, b = make_temp_dir(tmp_path / "new", ".x-"), make_temp_dir(tmp_path / "new", ".x-")
    finally:
        os.umask(old)
    assert a != b and a.name.startswith(".x-") and a.parent == tmp_path / "new"
    assert stat.S_IMODE(a.stat().st_mode) == 0o750
