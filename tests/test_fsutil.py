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
