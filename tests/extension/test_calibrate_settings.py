"""extension/calibrate_settings.py: what `posenc calibrate` refuses from its flags and the parent's meta.json and
config.yaml, with no torch (`check_calibrate`), before `calibrate_run` loads the parent; a config.yaml that does
not match its checksum is left to the loader to report."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from train_utils import tiny_config, write_corpus

from posenc_cli.errors import CheckpointError, ConfigError
from posenc_cli.extension.calibrate_settings import CalibrateSettings, check_calibrate
from posenc_cli.run.train import train

DROPE = CalibrateSettings("drope", ("4x",))


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("calibrate-settings")
    train(tiny_config(write_corpus(root), pos="nope", steps=2), root / "nope")
    return root / "nope"


def copy_with(parent: Path, to: Path, *, attn_scale: str, checksum: bool = True, train_length: bool = True) -> Path:
    """A copy of `parent` whose config.yaml sets model.attn_scale (meta.json's checksum of it updated unless
    `checksum=False`; its train_length dropped with `train_length=False`, as older runs lack it)."""
    shutil.copytree(parent, to)
    config = to / "config.yaml"
    text = config.read_text()
    assert "attn_scale: none" in text
    config.write_text(text.replace("attn_scale: none", f"attn_scale: {attn_scale}"))
    meta = json.loads((to / "meta.json").read_text())
    if checksum:
        meta["files"]["config.yaml"] = hashlib.sha256(config.read_bytes()).hexdigest()
    if not train_length:
        meta.pop("train_length")
    (to / "meta.json").write_text(json.dumps(meta))
    return to


def test_the_settings_import_no_torch() -> None:
    code = "import sys; import posenc_cli.extension.calibrate_settings; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_request_that_fits_passes_and_writes_nothing(parent: Path, tmp_path: Path) -> None:
    before = sorted(p.name for p in parent.parent.iterdir())
    check_calibrate(parent, DROPE)  # the default directory, beside the parent
    check_calibrate(parent, CalibrateSettings("head-scale", ("2x",)), tmp_path / "child")
    assert sorted(p.name for p in parent.parent.iterdir()) == before and not (tmp_path / "child").exists()


def test_a_temperature_is_read_from_the_verified_config_only(parent: Path, tmp_path: Path) -> None:
    """A config.yaml that sets a temperature is refused; one that was changed after it was saved is not judged by
    what it says (load_run then reports the mismatch)."""
    tempered = copy_with(parent, tmp_path / "tempered", attn_scale="logn")
    with pytest.raises(ConfigError, match=r"tempered already has a temperature \(model.attn_scale=logn\)$"):
        check_calibrate(tempered, DROPE)
    edited = copy_with(parent, tmp_path / "edited", attn_scale="logn", checksum=False)
    check_calibrate(edited, DROPE)
    from posenc_cli.extension.calibrate import calibrate_run

    with pytest.raises(CheckpointError, match="config.yaml: checksum mismatch"):
        calibrate_run(edited, DROPE, tmp_path / "child")


def test_the_training_length_comes_from_the_config_when_meta_lacks_it(parent: Path, tmp_path: Path) -> None:
    older = copy_with(parent, tmp_path / "older", attn_scale="none", train_length=False)
    with pytest.raises(ConfigError, match="--length 16: the fit length must exceed the training length 16"):
        check_calibrate(older, CalibrateSettings("drope", ("1x",)))


def test_the_parent_as_output_directory_is_refused_first(parent: Path) -> None:
    with pytest.raises(ConfigError, match="the output directory is the parent run"):
        check_calibrate(parent, CalibrateSettings("drope", ("1x",)), parent)
