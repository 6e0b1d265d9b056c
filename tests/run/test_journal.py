"""The commit journal, on plain bytes: a checkpoint's files replaced as one set, an uncommitted `.pending/` ignored
and dropped, a half-applied commit read as the new checkpoint and finished (`run.journal`)."""

from __future__ import annotations

import shutil
from pathlib import Path

from posenc_cli.run.journal import commit_checkpoint, committed_file, recover
from posenc_cli.run.layout import META_FILE, PENDING
from posenc_cli.run.meta import is_run_dir, read_meta
from posenc_cli.run.verified import read_verified

META = {"kind": "posenc-run", "schema_version": 1, "step": 0}


def test_commit_replaces_the_whole_set(tmp_path: Path) -> None:
    commit_checkpoint(tmp_path, {"a.bin": b"a1", "b.bin": b"b1"}, {**META, "step": 1})
    commit_checkpoint(tmp_path, {"a.bin": b"a2", "b.bin": b"b2"}, {**META, "step": 2})
    meta = read_meta(tmp_path)
    assert meta["step"] == 2 and read_verified(tmp_path, meta["files"], "a.bin") == b"a2"
    assert not (tmp_path / PENDING).exists()


def test_uncommitted_pending_is_ignored_then_dropped(tmp_path: Path) -> None:
    commit_checkpoint(tmp_path, {"a.bin": b"a1"}, {**META, "step": 1})
    (tmp_path / PENDING).mkdir()
    (tmp_path / PENDING / "a.bin").write_bytes(b"half-written")  # killed before meta.json: not committed
    meta = read_meta(tmp_path)
    assert meta["step"] == 1 and read_verified(tmp_path, meta["files"], "a.bin") == b"a1"
    recover(tmp_path)
    assert not (tmp_path / PENDING).exists() and (tmp_path / "a.bin").read_bytes() == b"a1"


def test_half_applied_commit_reads_as_the_new_checkpoint_and_recovers(tmp_path: Path) -> None:
    commit_checkpoint(tmp_path, {"a.bin": b"a1", "b.bin": b"b1"}, {**META, "step": 1})
    commit_checkpoint(tmp_path / "next", {"a.bin": b"a2", "b.bin": b"b2"}, {**META, "step": 2})
    pending = tmp_path / PENDING
    pending.mkdir()
    for name in ("b.bin", META_FILE):
        shutil.copy(tmp_path / "next" / name, pending / name)
    shutil.copy(tmp_path / "next" / "a.bin", tmp_path / "a.bin")  # a.bin already renamed into place, b.bin not
    meta = read_meta(tmp_path)
    assert meta["step"] == 2 and not is_run_dir(pending)  # the journal itself is not a run
    assert committed_file(tmp_path, "b.bin") == pending / "b.bin"
    assert [read_verified(tmp_path, meta["files"], n) for n in ("a.bin", "b.bin")] == [b"a2", b"b2"]
    recover(tmp_path)
    assert not pending.exists() and (tmp_path / "b.bin").read_bytes() == b"b2" and read_meta(tmp_path)["step"] == 2
