"""Faults through the CLI: a full or read-only disk, unavailable devices, hostile or broken run directories and
bad values each end in one line on stderr and exit code 2, and nothing of the user's is touched."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from train_utils import tiny_config, tiny_overrides, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.errors import CheckpointError, ConfigError
from posenc_cli.evaluation.runs import find_runs
from posenc_cli.run.load import load_run
from posenc_cli.run.train import train

runner = CliRunner()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("hostile-corpus"))


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Path:
    run = tmp_path_factory.mktemp("hostile-runs") / "rope"
    train(tiny_config(corpus, pos="rope", steps=2), run)
    return run


def one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


# -- devices ---------------------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_eval_device_cuda_names_the_flag_given(rope_run: Path) -> None:
    result = runner.invoke(app, ["eval-extrapolate", str(rope_run), "--device", "cuda", "--lengths", "1"])
    one_line_error(result, "--device cuda but CUDA is not available")
    assert "train.device" not in result.stderr


# -- storage ---------------------------------------------------------------------------------------------------


def _refuse_writes(monkeypatch: pytest.MonkeyPatch, module: str, name: str, code: int) -> None:
    def fail(path, *args, **kwargs):
        raise OSError(code, "simulated", str(path))

    monkeypatch.setattr(f"{module}.{name}", fail)


def test_full_disk_in_train_is_one_line_naming_the_path(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _refuse_writes(monkeypatch, "posenc_cli.run.journal", "atomic_write_bytes", errno.ENOSPC)
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", *tiny_overrides(corpus, steps=2), "--out", str(out)])
    one_line_error(result, "No space left on device", str(out / ".pending"))


def test_eval_on_read_only_storage_still_scores(rope_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _refuse_writes(monkeypatch, "posenc_cli.fsutil", "atomic_path", errno.EROFS)  # every atomic write refused
    result = runner.invoke(app, ["eval-extrapolate", str(rope_run), "--lengths", "1,2", "--tokens", "64"])
    assert result.exit_code == 0, result.output
    assert "Read-only file system" in result.stderr and "not cached" in result.stderr
    notes = [line for line in result.stderr.splitlines() if not line.startswith("[")]  # not the progress lines
    assert len(notes) == 1, result.stderr
    assert "1 run(s) evaluated" in result.stdout


def test_eval_json_on_a_full_disk_is_one_line(rope_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _refuse_writes(monkeypatch, "posenc_cli.api.evaluation", "atomic_write_json", errno.ENOSPC)  # --json's writer
    target = tmp_path / "all.json"
    args = ["eval-extrapolate", str(rope_run), "--lengths", "1", "--tokens", "64", "--json", str(target)]
    result = runner.invoke(app, args)
    one_line_error(result, "No space left on device", str(target))


# -- run directories that point outside themselves, at devices, or at absurd sizes ------------------------------


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("eval", ".lock"))
    return dst


def _set_file(run: Path, name: str, data: bytes | None = None, listed_as: str | None = None) -> None:
    """Write `data` as file `name` (None: leave the file) and record its checksum in meta.json as `listed_as`."""
    if data is not None:
        (run / name).write_bytes(data)
    meta = json.loads((run / "meta.json").read_text())
    meta["files"][listed_as or name] = hashlib.sha256(data if data is not None else b"").hexdigest()
    (run / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("name", ["../../../../dev/zero", "/dev/zero", "sub/model.safetensors", ".pending"])
def test_file_list_names_outside_the_run_are_refused(rope_run: Path, tmp_path: Path, name: str) -> None:
    run = _copy_run(rope_run, tmp_path / "run")
    _set_file(run, "x", listed_as=name)
    with pytest.raises(CheckpointError, match="not a plain file name inside the run directory"):
        load_run(run)


def test_symlink_to_a_device_is_refused(rope_run: Path, tmp_path: Path) -> None:
    run = _copy_run(rope_run, tmp_path / "run")
    (run / "model.safetensors").unlink()
    (run / "model.safetensors").symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match="points outside the run directory"):
        load_run(run)


def test_fifo_in_place_of_the_weights_is_refused_without_hanging(rope_run: Path, tmp_path: Path) -> None:
    run = _copy_run(rope_run, tmp_path / "run")
    (run / "model.safetensors").unlink()
    os.mkfifo(run / "model.safetensors")
    with pytest.raises(CheckpointError, match="not a regular file"):
        load_run(run)


@pytest.mark.parametrize("header_length", [2**40, 3])
def test_oversized_weights_file_is_refused_before_reading(rope_run: Path, tmp_path: Path, header_length: int) -> None:
    """A 1 GiB (sparse) file whose header is absurd or unreadable is never read into memory."""
    run = _copy_run(rope_run, tmp_path / "run")
    with open(run / "model.safetensors", "wb") as f:
        f.write(header_length.to_bytes(8, "little") + b"{}")
        f.truncate(2**30)
    with pytest.raises(CheckpointError, match="model.safetensors: 1073741824 bytes, more than the 67108864 it can be"):
        load_run(run)


def test_safetensors_header_describing_more_than_memory_is_refused(rope_run: Path, tmp_path: Path) -> None:
    run = _copy_run(rope_run, tmp_path / "run")
    header = json.dumps({"w": {"dtype": "F32", "shape": [2**38], "data_offsets": [0, 2**40]}}).encode()
    with open(run / "model.safetensors", "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + 2**40)  # sparse: occupies no disk
    with pytest.raises(CheckpointError, match="describes 1099511627776 bytes of tensors, more than memory holds"):
        load_run(run)


def test_absurd_model_size_in_config_is_refused_before_allocating(rope_run: Path, tmp_path: Path) -> None:
    run = _copy_run(rope_run, tmp_path / "run")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"].update(d_model=65536, n_layer=64)
    _set_file(run, "config.yaml", yaml.safe_dump(cfg).encode())
    with pytest.raises(ConfigError, match=r"model.d_model=65536 model.n_layer=64 is about 3.3e\+12 parameters"):
        load_run(run)


def test_absurd_model_size_in_train_is_one_line(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["train", *tiny_overrides(corpus), "model.d_model=100000", "model.n_layer=100", "--out", str(out)]
    result = runner.invoke(app, args)
    one_line_error(result, "model.d_model=100000 model.n_layer=100 is about", "training needs about")
    assert not out.exists()


def test_memory_estimate_matches_the_model() -> None:
    from posenc_cli.config import Config, ModelConfig
    from posenc_cli.model import build_model
    from posenc_cli.run.memory import approx_params, check_fits

    cfg = Config(model=ModelConfig(d_model=64, n_layer=2, n_head=2))
    assert approx_params(cfg.model, 257) == sum(p.numel() for p in build_model(cfg, 257).parameters())
    check_fits(cfg, 257, 16, "training", available=2**30)
    with pytest.raises(ConfigError, match="training needs about 0.0 GiB of memory and 0.0 GiB is available"):
        check_fits(cfg, 257, 16, "training", available=1000)


# -- a directory that is not a run ---------------------------------------------------------------------------------


def test_train_into_a_users_directory_touches_nothing(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    (out / ".pending").mkdir(parents=True)
    (out / ".pending" / "draft.txt").write_text("my notes")
    (out / "metrics.jsonl").write_text('{"mine": 1}\n')
    result = runner.invoke(app, ["train", *tiny_overrides(corpus, steps=2), "--out", str(out)])
    one_line_error(result, "is not empty and not a posenc run", "choose another --out")
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert left == [".pending", ".pending/draft.txt", "metrics.jsonl"]
    assert (out / "metrics.jsonl").read_text() == '{"mine": 1}\n'


def test_a_run_killed_before_its_first_checkpoint_is_started_again(corpus: Path, tmp_path: Path) -> None:
    from posenc_cli.run.run_dir import claim_run_dir

    out = tmp_path / "run"
    claim_run_dir(out)  # what train wrote first, before it was killed
    (out / ".pending").mkdir()
    (out / ".pending" / "model.safetensors").write_bytes(b"half")
    train(tiny_config(corpus, steps=2), out)
    assert load_run(out).meta.status == "complete"


# -- resume state validated against the model ----------------------------------------------------------------------


@pytest.fixture
def stopped_run(corpus: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    train(tiny_config(corpus, steps=2), run)
    return run


def _resume(corpus: Path, run: Path) -> None:
    train(tiny_config(corpus, steps=4), run, force_config=True)


def _edit_state(run: Path, edit) -> None:
    import safetensors.torch

    tensors = safetensors.torch.load_file(run / "state.safetensors")
    edit(tensors)
    safetensors.torch.save_file(tensors, run / "state.safetensors", metadata={"format": "pt"})
    _set_file(run, "state.safetensors", (run / "state.safetensors").read_bytes())


def test_wrong_shaped_optimizer_moment_is_refused(corpus: Path, stopped_run: Path) -> None:
    def shrink(tensors: dict) -> None:
        key = next(k for k in sorted(tensors) if k.endswith(".exp_avg"))
        tensors[key] = torch.zeros(4)

    _edit_state(stopped_run, shrink)
    with pytest.raises(CheckpointError, match=r"optimizer exp_avg of parameter \d+ is torch.float32 \(4,\), expected"):
        _resume(corpus, stopped_run)


def test_negative_optimizer_step_is_refused(corpus: Path, stopped_run: Path) -> None:
    def negative(tensors: dict) -> None:
        tensors[next(k for k in sorted(tensors) if k.endswith(".step"))] = torch.tensor(-3.0)

    _edit_state(stopped_run, negative)
    with pytest.raises(CheckpointError, match=r"optimizer step of parameter \d+ is invalid"):
        _resume(corpus, stopped_run)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("step", "abc", "step or tokens are not whole numbers"),
        ("tokens", -1, "step or tokens are not whole numbers"),
        ("elapsed_s", "soon", "elapsed_s is not a number"),
        ("rng", {"python": [3, "x", None], "numpy": {}}, "random-number state is invalid"),
    ],
)
def test_bad_state_json_fields_are_one_line(
    corpus: Path, stopped_run: Path, field: str, value: object, message: str
) -> None:
    info = json.loads((stopped_run / "state.json").read_text())
    info[field] = value
    _set_file(stopped_run, "state.json", json.dumps(info).encode())
    with pytest.raises(CheckpointError, match=message):
        _resume(corpus, stopped_run)


# -- garbage meta.json: reported as corrupt, naming the file, not as "no run" ------------------------------------


def _dir_with_meta(run: Path, text: str) -> Path:
    run.mkdir(parents=True)
    (run / "meta.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    return run


def _minimal_run(run: Path) -> Path:
    return _dir_with_meta(run, json.dumps({"kind": "posenc-run", "schema_version": 1, "step": 0, "files": {}}))


@pytest.mark.parametrize("text", ["{not json", "[1, 2, 3]", '"posenc-run"', "\udcff\udcfe\x00"])
@pytest.mark.parametrize("command", ["eval-extrapolate", "compare"])
def test_garbage_meta_json_is_reported_as_corrupt(tmp_path: Path, text: str, command: str) -> None:
    run = _dir_with_meta(tmp_path / "run", text)
    result = runner.invoke(app, [command, str(run)])
    one_line_error(result, f"{run / 'meta.json'}: unreadable or corrupt")
    assert "contains none" not in result.stderr


def test_search_finding_only_corrupt_runs_names_the_corrupt_file(tmp_path: Path) -> None:
    _dir_with_meta(tmp_path / "sweep" / "train" / "rope", "{not json")
    with pytest.raises(CheckpointError, match="rope/meta.json: unreadable or corrupt"):
        find_runs([tmp_path / "sweep"])


def test_run_search_skips_foreign_meta_json_and_corrupt_runs_beside_readable_ones(tmp_path: Path) -> None:
    top = _dir_with_meta(tmp_path / "project", json.dumps({"kind": "something-else"}))
    with pytest.raises(CheckpointError, match="not a run directory and contains none"):
        find_runs([top])
    good = _minimal_run(top / "runs" / "alibi")
    _dir_with_meta(top / "runs" / "rope", "{not json")
    assert find_runs([top]) == [good]


# -- tampered fields of meta.json and state.json: one line naming the file and the field ---------------------------


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("train_length", "abc", "a whole number >= 1"),
        ("base_length", -128, "a whole number >= 1"),  # accepted before: a `1× -128` column
        ("base_length", True, "a whole number >= 1"),
        ("step", -1, "a whole number >= 0"),
        ("steps", 2.5, "a whole number >= 0"),
        ("status", "done", "'running' or 'interrupted' or 'complete'"),
        ("parent", 7, "a string"),
        ("val_loss", "low", "a number or null"),
    ],
)
def test_tampered_meta_json_fields_are_one_line(
    rope_run: Path, tmp_path: Path, field: str, value: object, expected: str
) -> None:
    run = _copy_run(rope_run, tmp_path / "run")
    meta = json.loads((run / "meta.json").read_text())
    meta[field] = value
    (run / "meta.json").write_text(json.dumps(meta))
    before = sorted(p.name for p in run.iterdir())
    result = runner.invoke(app, ["eval-extrapolate", str(run), "--lengths", "1"])
    one_line_error(result, f"{run / 'meta.json'}: field '{field}' is {value!r}, expected {expected}")
    assert sorted(p.name for p in run.iterdir()) == before  # nothing written


def test_meta_json_nested_200000_deep_is_one_line(rope_run: Path, tmp_path: Path) -> None:
    run = _copy_run(rope_run, tmp_path / "run")
    (run / "meta.json").write_text("[" * 200_000 + "]" * 200_000)
    result = runner.invoke(app, ["eval-extrapolate", str(run), "--lengths", "1"])
    one_line_error(result, f"{run / 'meta.json'}: unreadable or corrupt", "nested deeper than")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda opt: opt.update(param_groups=[1, 2]), "field 'optimizer.param_groups' is not a list of groups"),
        (lambda opt: opt.update(param_groups=[{"params": ["a"]}]), "field 'optimizer.param_groups' is not a list"),
        (lambda opt: opt.update(extra={"0": 5}), "field 'optimizer.extra' is not a mapping"),
    ],
)
def test_tampered_optimizer_groups_in_state_json_are_one_line(
    corpus: Path, stopped_run: Path, edit, message: str
) -> None:
    info = json.loads((stopped_run / "state.json").read_text())
    edit(info["optimizer"])
    _set_file(stopped_run, "state.json", json.dumps(info).encode())  # checksum recomputed, as a tamperer would
    with pytest.raises(CheckpointError, match=f"state.json: {message}"):
        _resume(corpus, stopped_run)
    result = runner.invoke(app, ["train", "--resume", str(stopped_run), "train.steps=4", "--force-config"])
    one_line_error(result, "state.json: field 'optimizer")


# -- a sweep on a full disk, a bench case's lifetime, a kill inside calibrate's fit (issue #40 item 5) ------------


def test_a_sweep_whose_jobs_failed_on_the_storage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    from posenc_cli.analysis.rows import RunRecord
    from posenc_cli.cli.sweep import exit_code

    full = "OSError: [Errno 28] No space left on device: '/sweep/train/pos=rope/.pending'"
    own = "RuntimeError: the loss went NaN"
    assert exit_code([RunRecord(label="a", run_dir=Path("a"), status="failed", error=own)]) == 1
    records = [
        RunRecord(label="a", run_dir=Path("a"), status="failed", error=own),
        RunRecord(label="b", run_dir=Path("b"), status="failed", error=full),
    ]
    assert exit_code(records) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1 job(s) failed on the storage" in err[0] and "No space left on device" in err[0]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has died
    except FileNotFoundError:
        return False


@pytest.mark.integration  # subprocesses killed
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_a_bench_case_dies_with_its_parent(tmp_path: Path) -> None:
    """The parent starts a case's child as bench does (`die_with_parent`), then is SIGKILLed: the child goes too."""
    script = (
        "import subprocess, sys, time\n"
        "from posenc_cli.perf.bench import die_with_parent\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], preexec_fn=die_with_parent)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.kill()
    parent.wait()
    for _ in range(200):  # the kernel delivers the signal at the parent's exit; bounded wait, no timing asserted
        if not _alive(child):
            break
        time.sleep(0.05)
    alive = _alive(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive


@pytest.mark.integration  # subprocesses killed
def test_a_kill_inside_calibrates_fit_leaves_the_parent_and_no_half_child(corpus: Path, tmp_path: Path) -> None:
    """SIGKILL at the fit's first scored point; the parent is untouched, no child run is there, and the same command
    then writes the child a clean run writes."""
    from posenc_cli.extension.calibrate import calibrate_run
    from posenc_cli.extension.calibrate_settings import CalibrateSettings
    from posenc_cli.run.meta import is_run_dir

    parent = tmp_path / "nope"
    train(tiny_config(corpus, pos="nope", steps=4), parent)
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(parent.iterdir()) if p.is_file()}
    child = tmp_path / "child"
    script = (
        "import os, signal, sys\n"
        "from posenc_cli.api.calibration import calibrate\n"
        "def killed(done, planned, loss):\n"
        "    if done >= 2:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "calibrate(sys.argv[1], 'drope', ['4x'], sys.argv[2], progress=killed, tokens=128, step=0.5, c_max=1.0,"
        " refine=2)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(parent), str(child)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(parent.iterdir()) if p.is_file()}
    assert after == before
    assert not is_run_dir(child)  # nothing a later command would load as a run
    settings = CalibrateSettings("drope", ("4x",), tokens=128, step=0.5, c_max=1.0, refine=2)
    again = calibrate_run(parent, settings, child)
    clean = calibrate_run(parent, settings, tmp_path / "clean")
    assert again.status == "created" and again.c == clean.c and again.history == clean.history


def test_no_bench_round_or_case_starts_after_the_time_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """`bench --time-budget`: a spent deadline ends the rounds after the first and runs no further eval case."""
    from posenc_cli.perf import bench

    calls: list[str] = []
    cases = {"a": lambda: calls.append("a") or 1.0, "b": lambda: calls.append("b") or 2.0}
    assert bench.interleaved_rounds(cases, 5, deadline=time.monotonic() - 1) == {"a": [1.0], "b": [2.0]}
    assert calls == ["a", "b"]
    assert len(bench.interleaved_rounds(cases, 3, deadline=None)["a"]) == 3
    monkeypatch.setattr(bench, "eval_cases", lambda *a: [object(), object()])
    monkeypatch.setattr(bench, "spawn_eval_case", lambda *a, **k: pytest.fail("a case started after the budget"))
    out = bench.bench_eval(None, None, 0, None, "fp32", 1, lambda m: None, deadline=time.monotonic() - 1)  # type: ignore[arg-type]
    assert out == {}
    with pytest.raises(ConfigError, match="--time-budget"):
        bench.BenchOptions(time_budget_s=float("inf")).validate()
