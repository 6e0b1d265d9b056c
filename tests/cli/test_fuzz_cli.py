"""The command surface, fuzzed (issue #40): every numeric option of every command and every number of every config
group, found by introspection (a new option is covered the day it is added), fed hostile values, each refused in
one line with exit code 2, no traceback and nothing written; the same for `--config-dir` contents and the
transformers config fields posenc reads. A small sample runs as subprocesses under resource limits
(`integration`)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import resource
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from cli_utils import full_command_tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app

pytestmark = pytest.mark.integration  # CLI fuzzing (hypothesis, every numeric option): not in the fast lane

runner = CliRunner()
HUGE = "9" * 5000  # beyond Python's 4,300-digit int-from-string limit
HOSTILE_NUMBERS = ["nan", "inf", "-inf", "1e18", "-1e18", "1e308", HUGE, "-" + HUGE]
FUZZ = settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def numeric_options() -> list[tuple[str, str, bool]]:
    """(command, flag, integer) of every option whose value is a number (or a list of numbers)."""
    group = full_command_tree()
    found = []
    for name, command in sorted(group.commands.items()):
        for param in command.params:
            descriptor = getattr(param, "type_descriptor", None)
            if descriptor is None or not param.opts[0].startswith("--"):
                continue
            kinds = {a for a in (descriptor.annotation, *typing.get_args(descriptor.annotation)) if a in (int, float)}
            if kinds and bool not in typing.get_args(descriptor.annotation) and descriptor.annotation is not bool:
                found.append((name, param.opts[0], kinds == {int}))
    return found


def needs_argument(command: str) -> bool:
    group = full_command_tree()
    return any(p.param_type_name == "argument" and p.required for p in group.commands[command].params)


def one_line_refusal(result, flag: str | None = None) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    if flag is not None:
        assert flag in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module", autouse=True)
def _one_click_command():
    """Typer's runner builds the click command anew on every call (30 ms of CPU): build it once for this module."""
    import typer.testing

    command = full_command_tree()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(typer.testing, "_get_command", lambda _app: command)
        yield


@pytest.fixture
def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory that must stay empty: a refused command writes nothing."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_every_numeric_option_declares_its_range() -> None:
    from posenc_cli.api.option_ranges import option_bound

    options = numeric_options()
    assert len(options) > 50  # the walk found the commands' options
    missing = [f"{command} {flag}" for command, flag, _ in options if option_bound(command, flag) is None]
    assert not missing, f"declare a range in posenc_cli/api/option_ranges.py for: {missing}"


def _out_of_range(command: str, flag: str, integer: bool) -> list[str]:
    """Values just outside the declared range (none where the table is not there: the old commit)."""
    try:
        from posenc_cli.api.option_ranges import option_bound
    except ImportError:
        return []
    bound = option_bound(command, flag)
    if bound is None:
        return []
    out = []
    if math.isfinite(bound.high):
        out.append(str(int(bound.high) + 1) if integer else repr(bound.high * 2 + 1))
    if math.isfinite(bound.low):
        out.append(str(int(bound.low) - 1) if integer else repr(bound.low - 1.5))
    return out


@pytest.mark.parametrize(("command", "flag", "integer"), numeric_options(), ids=lambda x: str(x))
@FUZZ
@given(data=st.data())
def test_a_hostile_number_is_one_line(command: str, flag: str, integer: bool, data, empty_cwd: Path) -> None:
    value = data.draw(st.sampled_from(HOSTILE_NUMBERS + _out_of_range(command, flag, integer)))
    args = [command, *(["no-such-run"] if needs_argument(command) else []), flag, value]
    result = runner.invoke(app, args)
    one_line_refusal(result, flag if _bounded_above(command, flag) else None)  # else the run's limit refuses it
    assert not any(empty_cwd.iterdir())


def _bounded_above(command: str, flag: str) -> bool:
    try:
        from posenc_cli.api.option_ranges import option_bound
    except ImportError:  # the old commit
        return True
    bound = option_bound(command, flag)
    return bound is None or math.isfinite(bound.high)


# -- config keys, by introspection of the config dataclasses -----------------------------------------------------


def config_number_keys() -> list[str]:
    """Dotted keys of every int or float field of the config groups (the default scheme's options included)."""
    from posenc_cli.config import Config

    keys = []
    cfg = Config()
    for group in dataclasses.fields(cfg):
        value = getattr(cfg, group.name)
        hints = typing.get_type_hints(type(value))
        for f in dataclasses.fields(value):
            kinds = set(typing.get_args(hints[f.name])) | {hints[f.name]}
            if kinds & {int, float} and bool not in kinds and f.init:
                keys.append(f"{group.name}.{f.name}")
    return keys


@pytest.mark.parametrize("key", config_number_keys())
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.sampled_from(["nan", "inf", "-inf", "1e18", "-1e18", "1e308", HUGE]))
def test_a_hostile_config_number_is_one_line(key: str, value: str, empty_cwd: Path) -> None:
    """Through the overrides every command takes (`train --out` never reached: nothing is written)."""
    result = runner.invoke(app, ["train", "model=tiny", f"{key}={value}", "--out", str(empty_cwd / "run")])
    one_line_refusal(result)
    assert not any(empty_cwd.iterdir())


def test_a_long_override_is_a_value_never_a_file_name(empty_cwd: Path) -> None:
    """A 300-byte override ('File name too long' once) is refused as a value; a 10-entry layout is read in full."""
    result = runner.invoke(app, ["train", "model=tiny", "pos.base=" + "1" * 300, "--out", str(empty_cwd / "r")])
    line = one_line_refusal(result)
    assert "pos.base" in line and "File name too long" not in line
    from posenc_cli.cli.app import split_args

    layers = "pos.layers=[" + ",".join(["{name:rope,span:sliding,window:8}"] * 9 + ["{name:nope}"]) + "]"
    assert split_args([layers, "x" * 300]) == (["x" * 300], [layers])


# -- --config-dir contents -------------------------------------------------------------------------------------


def _config_dir(tmp_path: Path, case: str) -> Path:
    root = tmp_path / "configs"
    (root / "pos").mkdir(parents=True)
    target = root / "pos" / "mine.yaml"  # never selected: the directory is checked as a whole
    if case == "huge-int":
        target.write_text(f"base: {HUGE}\n")
    elif case == "fifo":
        os.mkfifo(target)
    elif case == "dev-zero":
        target.symlink_to("/dev/zero")
    elif case == "not-utf8":
        target.write_bytes(b"base: \xff\xfe\n")
    elif case == "long-name":
        (root / "pos" / ("x" * 250 + ".yaml")).write_text("base: 10000\n")
        target.write_text("- a list, not a mapping\n")
    return root


@pytest.mark.parametrize("case", ["huge-int", "fifo", "dev-zero", "not-utf8", "long-name"])
def test_a_hostile_config_dir_is_one_line(case: str, tmp_path: Path, empty_cwd: Path) -> None:
    root = _config_dir(tmp_path, case)
    result = runner.invoke(app, ["train", "--config-dir", str(root), "model=tiny", "--out", str(empty_cwd / "r")])
    one_line_refusal(result, "--config-dir")
    assert not any(empty_cwd.iterdir())


# -- list options parsed by the commands -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def nope_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # deferred: torch
    from posenc_cli.run.train import train

    root = tmp_path_factory.mktemp("fuzz-run")
    run = root / "nope"
    train(tiny_config(write_corpus(root), pos="nope", steps=2), run)
    return run


def _tree(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "args",
    [
        ["calibrate", "{run}", "--length", "infx"],
        ["calibrate", "{run}", "--length", "nanx"],
        ["calibrate", "{run}", "--length", "1000000"],
        ["calibrate", "{run}", "--length", HUGE],
        ["calibrate", "{run}", "--temperature", "head-scale", "--lr", "inf"],
        ["calibrate", "{run}", "--tokens", "1000000000000000"],
        ["calibrate", "{run}", "--step", "1e-12"],
        ["calibrate", "{run}", "--c-max", "1e18"],
        ["calibrate", "{run}", "--refine", "1000000000000"],
        ["calibrate", "{run}", "--temperature", "head-scale", "--steps", "1000000000000"],
        ["calibrate", "{run}", "--temperature", "head-scale", "--batch-size", "1000000000"],
        ["eval-algorithmic", "{run}", "--lengths", "1-1000000000"],
        ["eval-algorithmic", "{run}", "--lengths", "1-" + HUGE],
        ["eval-algorithmic", "{run}", "--examples", "1000000000000"],
        ["bench", "--time-budget", "inf"],
    ],
    ids=lambda a: " ".join(x[:20] for x in a),
)
def test_the_issue_cases_are_one_line(args: list[str], nope_run: Path, empty_cwd: Path) -> None:
    before = _tree(nope_run.parent)
    result = runner.invoke(app, [a.replace("{run}", str(nope_run)) for a in args])
    one_line_refusal(result)
    assert _tree(nope_run.parent) == before and not any(empty_cwd.iterdir())


def test_a_300_byte_out_directory_is_one_line(nope_run: Path, tmp_path: Path) -> None:
    out = tmp_path / ("x" * 300)
    before = _tree(nope_run.parent)
    result = runner.invoke(app, ["calibrate", str(nope_run), "--out", str(out), "--tokens", "64"])
    assert "File name too long" in one_line_refusal(result)
    assert _tree(nope_run.parent) == before


# -- transformers config fields --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hf_utils import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("fuzz-hf") / "m", "llama")


def _hf_copy(hf_dir: Path, tmp_path: Path, **changes: object) -> Path:
    import shutil

    copy = tmp_path / "hf"
    shutil.copytree(hf_dir, copy)
    raw = json.loads((copy / "config.json").read_text())
    raw.update(changes)
    (copy / "config.json").write_text(json.dumps(raw))
    return copy


def hf_fields() -> list[str]:
    try:
        from posenc_cli.run.hf_run import HF_FIELD_BOUNDS
    except ImportError:  # the old commit: the fields it reads
        return ["sliding_window", "max_position_embeddings", "attention_chunk_size"]
    return sorted(HF_FIELD_BOUNDS)


@pytest.mark.parametrize("field", hf_fields())
@FUZZ
@given(value=st.sampled_from([-5, 0, 10**18, -(10**18), 1e308, "x" * 300]))
def test_a_hostile_transformers_field_is_refused_before_loading(field: str, value, hf_dir: Path, tmp_path: Path):
    from posenc_cli.errors import CheckpointError
    from posenc_cli.run.hf_run import inspect_hf_dir

    path = tmp_path / str(abs(hash((field, repr(value)))))  # a fresh directory per example
    path.mkdir()
    raw = {**json.loads((hf_dir / "config.json").read_text()), field: value}
    (path / "config.json").write_text(json.dumps(raw))  # only config.json: it is refused before anything else is read
    with pytest.raises(CheckpointError, match=field):
        inspect_hf_dir(path)


@pytest.mark.parametrize(("command", "window"), [("eval-extrapolate", -5), ("extend", 0)])
def test_a_sliding_window_out_of_range_is_one_line(command: str, window: int, hf_dir: Path, tmp_path: Path) -> None:
    path = _hf_copy(hf_dir, tmp_path, sliding_window=window, model_type="mistral", architectures=["MistralForCausalLM"])
    before = _tree(path)
    args = [command, str(path), "--lengths", "1"] if command == "eval-extrapolate" else [command, str(path)]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "child")] if command == "extend" else args)
    assert "sliding_window" in one_line_refusal(result)
    assert _tree(path) == before and not (tmp_path / "child").exists()


# -- a subprocess sample, under resource limits ----------------------------------------------------------------

# Generous for a loaded CI machine (the issue's budget, 3 CPU-seconds and 400 MB, is measured in the closing note):
# a command past the CPU limit is killed by SIGXCPU, never exit 2; 8 GiB of address space as the issue's runs had.
CPU_SECONDS, ADDRESS_SPACE, MAX_RSS_MB = 20, 8 << 30, 1500


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


@pytest.mark.integration
@pytest.mark.parametrize(
    "args",
    [
        ["calibrate", "{run}", "--length", "infx"],
        ["eval-algorithmic", "{run}", "--lengths", "1-1000000000"],
        ["calibrate", "{run}", "--temperature", "head-scale", "--lr", "inf"],
        ["train", "model=tiny", "pos.base=" + "1" * 300],
    ],
    ids=lambda a: " ".join(x[:20] for x in a),
)
def test_a_hostile_command_in_its_own_process(args: list[str], nope_run: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "posenc_cli", *(a.replace("{run}", str(nope_run)) for a in args)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_limited)
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own CPU time and peak memory
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), err
    assert usage.ru_utime + usage.ru_stime < CPU_SECONDS and usage.ru_maxrss < MAX_RSS_MB * 1024
    assert not any(tmp_path.iterdir())
