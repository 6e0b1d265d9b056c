"""RunMeta: meta.json as a type (issue #19 item 3): round trips key for key, lengths, and meta.json written byte for
byte as before the type (`run.meta`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_run_meta_round_trips_an_old_meta_json_key_for_key(tmp_path: Path) -> None:
    from posenc_cli.run.journal import commit_checkpoint, sha256_bytes
    from posenc_cli.run.meta import RunMeta, read_meta, read_run_meta

    old = {
        "kind": "posenc-run",
        "schema_version": 1,
        "status": "complete",
        "step": 7,
        "steps": 7,
        "a_key_from_the_future": {"x": 1},
        "train_length": 64,
        "parent": None,
        "extend": {"method": "yarn"},
        "files": {"model.safetensors": "a" * 64},
    }
    meta = RunMeta.from_json(old)
    assert (meta.step, meta.train_length, meta.base_length, meta.parent) == (7, 64, None, None)
    assert set(meta.record) == {"steps", "a_key_from_the_future", "extend"}
    assert json.dumps(meta.to_json()) == json.dumps(old)  # same keys, same order, nothing added
    written = commit_checkpoint(tmp_path / "run", {"model.safetensors": b"w"}, meta)
    assert list(written) == list(old) and read_meta(tmp_path / "run") == written
    assert read_run_meta(tmp_path / "run").files == {"model.safetensors": sha256_bytes(b"w")}


def test_lengths_default_from_the_config() -> None:
    from dataclasses import replace

    from posenc_cli.config import Config, TrainConfig
    from posenc_cli.run.meta import RunMeta

    cfg = Config(train=TrainConfig(seq_len=96))
    assert RunMeta(step=0).lengths(cfg) == (96, 96)
    assert RunMeta(step=0, train_length=256, base_length=128).lengths(cfg) == (256, 128)
    meta = RunMeta(step=0, train_length=200)
    assert meta.lengths(cfg) == (200, 200)
    keys = ["kind", "schema_version", "step", "train_length", "base_length", "files"]  # unset identity keys left out
    assert list(replace(meta, base_length=100).to_json()) == keys


def _old_training_meta(status: str, step: int, seq_len: int, r: dict, extra: dict) -> dict:
    """meta.json as train.py built it before `RunMeta.for_training` (kept here as the byte-compatibility oracle)."""
    meta = {
        "kind": "posenc-run",
        "schema_version": 1,
        "status": status,
        "step": step,
        **{k: r[k] for k in ("steps", "tokens", "train_loss", "val_loss", "best_val_loss", "seed", "pos", "model")},
        "n_params": r["n_params"],
        "train_length": seq_len,
        "base_length": seq_len,
        "parent": None,
        **{k: r[k] for k in ("precision", "device", "threads", "tokens_per_s", "wall_time_s", "created", "updated")},
        **{k: r[k] for k in ("versions", "data", "tokenizer")},
    }
    meta.update(extra)
    meta["extra_keys"] = sorted(extra)
    return meta


def _old_scaled_copy_meta(parent: dict, train_length: int, extra: dict, now: str) -> dict:
    """meta.json as extend._write_scaled_copy built it before `RunMeta.scaled_copy`."""
    meta = {k: v for k, v in parent.items() if k not in ("files", "extra_keys")}
    meta.update(
        status="complete",
        train_length=train_length,
        val_loss=None,
        best_val_loss=None,
        created=now,
        updated=now,
        **extra,
    )
    meta["extra_keys"] = sorted(extra)
    return meta


_RECORD = {
    "steps": 10,
    "tokens": 640,
    "train_loss": 2.5,
    "val_loss": None,
    "best_val_loss": 2.75,
    "seed": 3,
    "pos": "rope",
    "model": "tiny",
    "n_params": 1234,
    "precision": "fp32",
    "device": "cpu",
    "threads": 1,
    "tokens_per_s": 99.5,
    "wall_time_s": 1.25,
    "created": "2026-01-01T00:00:00+00:00",
    "updated": "2026-01-02T00:00:00+00:00",
    "versions": {"posenc": "0", "torch": "2", "python": "3", "numpy": "1"},
    "data": {"source": "stdlib", "fingerprint": "f"},
    "tokenizer": {"kind": "byte", "vocab_size": 256, "fingerprint": "t"},
}
_EXTENSION = {"parent": "/runs/parent", "base_length": 64, "extend": {"method": "yarn", "scaling": {"factor": 4.0}}}


@pytest.mark.parametrize("extra", [{}, _EXTENSION, {"a_new_key": [1, 2], "parent": "/p"}])
def test_meta_json_of_training_is_byte_for_byte_the_old_layout(tmp_path: Path, extra: dict) -> None:
    from posenc_cli.run.journal import commit_checkpoint
    from posenc_cli.run.layout import META_FILE
    from posenc_cli.run.meta import RunMeta, TrainingRecord

    files = {"model.safetensors": b"w"}
    meta = RunMeta.for_training(
        status="running", step=5, train_length=128, record=TrainingRecord(**_RECORD), extra=extra
    )
    commit_checkpoint(tmp_path / "new", files, meta)
    commit_checkpoint(tmp_path / "old", files, _old_training_meta("running", 5, 128, _RECORD, extra))
    assert (tmp_path / "new" / META_FILE).read_bytes() == (tmp_path / "old" / META_FILE).read_bytes()
    assert meta.extra == extra  # what a resumed save writes again


@pytest.mark.parametrize("extra", [_EXTENSION, {**_EXTENSION, "extend": {"method": "linear"}}])
def test_meta_json_of_a_scaled_copy_is_byte_for_byte_the_old_layout(tmp_path: Path, extra: dict) -> None:
    from posenc_cli.run.journal import commit_checkpoint
    from posenc_cli.run.layout import META_FILE
    from posenc_cli.run.meta import RunMeta, TrainingRecord

    parent = commit_checkpoint(
        tmp_path / "parent",
        {"model.safetensors": b"w"},
        RunMeta.for_training(status="complete", step=10, train_length=64, record=TrainingRecord(**_RECORD), extra={}),
    )
    now = "2026-03-03T00:00:00+00:00"
    files = {"model.safetensors": b"w", "config.yaml": b"c"}
    new = RunMeta.scaled_copy(RunMeta.from_json(parent), train_length=256, extra=extra, now=now)
    commit_checkpoint(tmp_path / "new", files, new)
    commit_checkpoint(tmp_path / "old", files, _old_scaled_copy_meta(parent, 256, extra, now))
    assert (tmp_path / "new" / META_FILE).read_bytes() == (tmp_path / "old" / META_FILE).read_bytes()
    assert new.parent == "/runs/parent" and new.train_length == 256 and new.base_length == 64
