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
from posenc_cli.run.layout import META_FILE, MODEL_FILE, STATE_FILE
from posenc_cli.run.load import load_run
from posenc_cli.run.meta import is_run_dir
from posenc_cli.run.train import train
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
