"""Untrusted JSON/YAML files: each hostile shape is one `UserError` line naming the path, never a hang or traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from posenc_cli.errors import CheckpointError, ConfigError
from posenc_cli.untrusted import load_json, load_yaml, loads_json


def test_plain_files_load(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"x": [1, 2, {"y": null}]}')
    (tmp_path / "a.yaml").write_text("x: [1, 2]\ny: {z: 3}\n")
    (tmp_path / "empty.yaml").write_text("")
    assert load_json(tmp_path / "a.json", what="meta") == {"x": [1, 2, {"y": None}]}
    assert load_yaml(tmp_path / "a.yaml", what="config") == {"x": [1, 2], "y": {"z": 3}}
    assert load_yaml(tmp_path / "empty.yaml", what="config") is None


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "meta.json"
    os.mkfifo(fifo)  # nobody writes it: open() or read() of it would block forever
    with pytest.raises(ConfigError, match="meta.json: run metadata is not a regular file \\(a FIFO\\)"):
        load_json(fifo, what="run metadata")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_yaml(fifo, what="config group")


def test_a_directory_and_a_missing_file_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=f"{tmp_path}: run metadata is not a regular file \\(a directory\\)"):
        load_json(tmp_path, what="run metadata", error=CheckpointError)
    with pytest.raises(CheckpointError, match="nope.json: run metadata not found"):
        load_json(tmp_path / "nope.json", what="run metadata", error=CheckpointError)


def test_a_file_over_the_limit_is_refused_naming_path_and_limit(tmp_path: Path) -> None:
    big = tmp_path / "config.json"
    big.write_text("[" + "0," * 600 + "0]")
    with pytest.raises(ConfigError, match="config.json: transformers config is larger than 1 KiB") as info:
        load_json(big, what="transformers config", max_bytes=1024)
    assert "\n" not in str(info.value)
    assert load_json(big, what="transformers config", max_bytes=4096)[-1] == 0


def test_json_nested_200000_deep_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "meta.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(CheckpointError, match="meta.json: run metadata is nested deeper than 64 levels"):
        load_json(deep, what="run metadata", error=CheckpointError)
    with pytest.raises(ConfigError, match="nested deeper than 3 levels"):
        loads_json('{"a": {"b": {"c": {"d": 1}}}}', source="header", what="x", max_depth=3)


def test_yaml_nested_200000_deep_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "pos.yaml"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ConfigError, match="pos.yaml: config group is"):
        load_yaml(deep, what="config group")
    block = tmp_path / "block.yaml"
    block.write_text("".join(" " * i + "a:\n" for i in range(100)))
    with pytest.raises(ConfigError, match="nested deeper than 64 levels"):
        load_yaml(block, what="config group")


def test_yaml_python_tags_are_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    bad = tmp_path / "rope.yaml"
    bad.write_text(f"name: rope\nbase: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError) as info:
        load_yaml(bad, what="config group")
    msg = str(info.value)
    assert msg.startswith(f"{bad}: config group is not valid YAML (could not determine a constructor for the tag")
    assert "python/object/apply:os.system" in msg and "line 2" in msg and "\n" not in msg
    assert not marker.exists()


def test_yaml_alias_bombs_are_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")  # 10**9 leaves when walked
    with pytest.raises(ConfigError, match="bomb.yaml: sweep file has more than 2000000 entries"):
        load_yaml(bomb, what="sweep file")


def test_broken_text_is_one_line(tmp_path: Path) -> None:
    for name, data, match in [
        ("a.json", b'{"a": 1,', "is not valid JSON \\(Expecting property name"),
        ("b.json", b"\xff\xfe{", "is not (UTF-8 text|valid JSON)"),
        ("c.json", b'{"a": ' + b"1" * 5000 + b"}", "is not valid JSON \\(Exceeds the limit"),
        ("d.yaml", b"a: [1\n", "is not valid YAML \\(did not find expected"),
        ("e.yaml", b"\xff\xfe", "is not UTF-8 text"),
    ]:
        path = tmp_path / name
        path.write_bytes(data)
        load = load_json if name.endswith(".json") else load_yaml
        with pytest.raises(ConfigError, match=match) as info:
            load(path, what="file")
        assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)
