"""load_run: verified loading that rejects every damaged or hostile file without executing anything."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch
from train_utils import tiny_config, write_corpus

from posenc_cli.errors import CheckpointError
from posenc_cli.run.journal import commit_checkpoint, committed_file, recover
from posenc_cli.run.layout import META_FILE, MODEL_FILE, PENDING, STATE_FILE
from posenc_cli.run.load import load_run
from posenc_cli.run.meta import is_run_dir, read_meta
from posenc_cli.run.train import train
from posenc_cli.run.verified import read_verified
from posenc_cli.run.weights import model_file_bytes


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("trained")
    run = base / "run"
    train(tiny_config(write_corpus(base), steps=4, save_every=2), run)
    return run


@pytest.fixture
def run(trained: Path, tmp_path: Path) -> Path:
    """A fresh copy of the trained run that a test may damage."""
    return Path(shutil.copytree(trained, tmp_path / "run"))


class _Payload:
    """Unpickling this creates a marker file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _pickle_payload(marker: Path) -> bytes:
    return pickle.dumps({"weights": _Payload(marker)})


def _reseal(run: Path, name: str) -> None:
    """Update meta.json's checksum of `name`, as an attacker who edits both files would."""
    meta = json.loads((run / META_FILE).read_text())
    meta["files"][name] = hashlib.sha256((run / name).read_bytes()).hexdigest()
    (run / META_FILE).write_text(json.dumps(meta))


def test_intact_run_loads(run: Path) -> None:
    loaded = load_run(run)
    assert loaded.meta.step == 4 and not loaded.model.training
    x = torch.randint(0, 257, (2, 8))
    assert loaded.model(x).shape == (2, 8, 257)
    assert is_run_dir(run)


@pytest.mark.parametrize("name", [MODEL_FILE, STATE_FILE, "state.json", "config.yaml"])
@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "bitflip", "missing"])
def test_damaged_files_are_rejected_naming_the_file(run: Path, name: str, damage: str) -> None:
    path = run / name
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "garbage":
        path.write_bytes(b"\x00\xffnot a checkpoint" * 100)
    elif damage == "bitflip":
        flipped = bytearray(data)
        flipped[len(data) * 3 // 4] ^= 0x01
        path.write_bytes(bytes(flipped))
    else:
        path.unlink()
    with pytest.raises(CheckpointError, match=rf"{name}: (checksum mismatch|missing)"):
        load_run(run)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_resealed_damage_is_still_caught_by_the_parser(run: Path, damage: str) -> None:
    path = run / MODEL_FILE
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"garbage" * 50)
    _reseal(run, MODEL_FILE)
    with pytest.raises(CheckpointError, match=f"{MODEL_FILE}: not a valid safetensors file"):
        load_run(run)


def test_pickle_payload_never_runs(run: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    control = tmp_path / "control"
    pickle.loads(_pickle_payload(control))  # the payload works when unpickled...
    assert control.exists()
    for name in (STATE_FILE, MODEL_FILE):
        (run / name).write_bytes(_pickle_payload(marker))
        with pytest.raises(CheckpointError, match=name):
            load_run(run)
        _reseal(run, name)
        with pytest.raises(CheckpointError, match=name):
            if name == STATE_FILE:  # the resume state is parsed when a run is continued
                train(tiny_config(write_corpus(tmp_path), steps=8, save_every=2), run, force_config=True)
            else:
                load_run(run)
    torch.save({"weights": _Payload(marker)}, run / MODEL_FILE)  # a torch.save file, resealed
    _reseal(run, MODEL_FILE)
    with pytest.raises(CheckpointError, match=MODEL_FILE):
        load_run(run)
    assert not marker.exists()  # ...but loading never unpickled it


def _replace_tensors(run: Path, edit) -> None:
    tensors = safetensors.torch.load_file(run / MODEL_FILE)
    edit(tensors)
    safetensors.torch.save_file(tensors, run / MODEL_FILE)
    _reseal(run, MODEL_FILE)


def test_non_finite_weights_are_rejected(run: Path) -> None:
    def poison(t: dict) -> None:
        t["norm_f.weight"][0] = float("nan")

    _replace_tensors(run, poison)
    with pytest.raises(CheckpointError, match="'norm_f.weight' has non-finite values"):
        load_run(run)


def test_wrong_shapes_and_keys_are_rejected(run: Path) -> None:
    _replace_tensors(run, lambda t: t.__setitem__("norm_f.weight", torch.ones(7)))
    with pytest.raises(CheckpointError, match=r"'norm_f.weight' is torch.float32 \(7,\), expected"):
        load_run(run)
    _replace_tensors(run, lambda t: t.__setitem__("extra.weight", torch.ones(2)))
    with pytest.raises(CheckpointError, match="unexpected tensor 'extra.weight'"):
        load_run(run)
    _replace_tensors(run, lambda t: (t.pop("extra.weight"), t.pop("norm_f.weight")))
    with pytest.raises(CheckpointError, match="missing tensor 'norm_f.weight'"):
        load_run(run)


def test_tied_embedding_is_stored_once_and_safetensors_load_model_accepts_it(run: Path) -> None:
    stored = safetensors.torch.load_file(run / MODEL_FILE)
    assert ("wte.weight" in stored) != ("lm_head.weight" in stored)
    loaded = load_run(run)
    assert loaded.model.wte.weight is loaded.model.lm_head.weight
    missing, unexpected = safetensors.torch.load_model(loaded.model, run / MODEL_FILE)
    assert not missing and not unexpected


def test_model_file_bytes_are_the_same_on_every_save() -> None:
    # Issue #16: safetensors writes its metadata from a HashMap in random order, so a resumed run's weights file
    # differed from an uninterrupted run's. Three tied pairs give four metadata keys (24 orders).
    model = torch.nn.Module()
    for name in ("a", "b", "c"):
        setattr(model, name, torch.nn.Linear(3, 3, bias=False))
        setattr(model, f"{name}_tied", getattr(model, name))
    files = {model_file_bytes(model) for _ in range(12)}
    assert len(files) == 1
    (data,) = files
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    assert list(header["__metadata__"]) == sorted(header["__metadata__"])
    assert torch.equal(safetensors.torch.load(data)["a.weight"], model.a.weight)


def test_not_a_run_directory(tmp_path: Path, run: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="empty is not a posenc run directory"):
        load_run(tmp_path / "empty")
    assert not is_run_dir(tmp_path / "empty")
    meta = json.loads((run / META_FILE).read_text())
    (run / META_FILE).write_text(json.dumps({**meta, "kind": "something-else"}))
    with pytest.raises(CheckpointError, match="is not a posenc run directory"):
        load_run(run)
    (run / META_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match=f"{META_FILE}: unreadable or corrupt"):
        load_run(run)


# -- the commit journal, on plain bytes ---------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------------------------
# RunMeta: meta.json as a type (issue #19 item 3).


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
