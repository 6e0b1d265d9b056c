"""extension/settings.py: an extension's settings and the refusals of a parent that need no checkpoint, all without
torch (so `posenc extend` refuses a user error in one line before loading it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posenc_cli.config import ExtendConfig
from posenc_cli.errors import UserError
from posenc_cli.extension.settings import check_parent, default_out_dir


def meta_only_run(path: Path, *, step: int, steps: int) -> Path:
    """A directory whose meta.json `read_meta` accepts (no files listed): enough for what `check_parent` reads."""
    path.mkdir()
    status = "complete" if step == steps else "running"
    meta = {"kind": "posenc-run", "schema_version": 1, "files": {}, "step": step, "steps": steps, "status": status}
    (path / "meta.json").write_text(json.dumps(meta))
    return path


def transformers_dir(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


def test_default_out_dir_is_next_to_the_parent(tmp_path: Path) -> None:
    assert default_out_dir(tmp_path / "rope", ExtendConfig(method="yarn", factor=4)) == tmp_path / "rope-yarnx4"
    ft = ExtendConfig(method="linear", factor=1.5, finetune_steps=60)
    assert default_out_dir(tmp_path / "rope", ft) == tmp_path / "rope-linearx1.5-ft60"


def test_check_parent_tells_a_transformers_directory_from_a_finished_run(tmp_path: Path) -> None:
    assert check_parent(meta_only_run(tmp_path / "run", step=4, steps=4), tmp_path / "child") is False
    assert check_parent(transformers_dir(tmp_path / "hf"), tmp_path / "child") is True


def test_check_parent_refuses_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    incomplete = meta_only_run(tmp_path / "incomplete", step=0, steps=60)
    hf = transformers_dir(tmp_path / "hf")
    cases = [
        (tmp_path / "missing", {}, f"run directory {tmp_path / 'missing'} does not exist"),
        (tmp_path / "empty", {}, "is not a posenc run directory"),
        (incomplete, {}, r"is incomplete \(training stopped at step 0 of 60\)"),
        (hf, {"search": True}, "--search needs a posenc run"),
        (hf, {"logn": True}, "--logn applies to posenc runs only"),
        (hf, {"remap": "rerope"}, "rerope applies to posenc runs only"),
    ]
    for parent, asked, message in cases:
        with pytest.raises(UserError, match=message) as e:
            check_parent(parent, tmp_path / "child", **asked)  # type: ignore[arg-type]
        assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="the output directory is the parent run"):  # before what the parent is
        check_parent(incomplete, incomplete)


def test_the_settings_import_no_torch() -> None:
    code = "import sys; import posenc_cli.extension.settings; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
