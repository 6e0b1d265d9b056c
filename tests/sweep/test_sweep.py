"""End-to-end sweeps with a micro model: basic, joblib and submitit launchers, two stages, re-runs, failures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from launchers import needs_joblib, needs_submitit
from sweep_utils import MICRO_MODEL, ONE_STAGE, REMAP, TWO_STAGES
from typer.testing import CliRunner

from posenc_cli.cli import app

pytestmark = pytest.mark.integration  # end to end (sweeps, launchers, DDP, compile): not in the fast lane

runner = CliRunner()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    (root / "corpus").mkdir()
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda"]
    for i in range(6):
        text = " ".join(words[(i * 7 + j * j) % len(words)] for j in range(600))
        (root / "corpus" / f"doc{i}.txt").write_text(text)
    cfg = root / "cfg"
    (cfg / "model").mkdir(parents=True)
    (cfg / "sweep").mkdir()
    (cfg / "model" / "micro.yaml").write_text(MICRO_MODEL)
    (cfg / "sweep" / "two.yaml").write_text(TWO_STAGES)
    (cfg / "sweep" / "one.yaml").write_text(ONE_STAGE)
    (cfg / "sweep" / "remap.yaml").write_text(REMAP)
    return root


def sweep(workspace: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    monkeypatch.chdir(workspace)
    result = runner.invoke(app, ["sweep", *args, "--config-dir", str(workspace / "cfg")], terminal_width=200)
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def two_stage(workspace: Path) -> tuple[Path, str]:
    with pytest.MonkeyPatch.context() as mp:
        code, output = sweep(workspace, mp, "two", "--out", "two")
    assert code == 0, output
    return workspace / "two", output


def test_two_stage_sweep_trains_once_and_extends_the_rope_run(two_stage: tuple[Path, str]) -> None:
    out, output = two_stage
    for job in ("train/pos=rope", "train/pos=alibi", "extend/pos=rope/default"):
        assert (out / job / "eval" / "extrapolate.json").is_file(), job
    meta = json.loads((out / "extend/pos=rope/default/meta.json").read_text())
    assert Path(meta["parent"]).resolve() == (out / "train/pos=rope").resolve()
    # Outputs of the comparison, in the sweep directory.
    for name in ("results.csv", "results.json", "extrapolation.png", "per_position.png", "sweep.json"):
        assert (out / name).stat().st_size > 0, name
    records = json.loads((out / "results.json").read_text())
    assert {r["label"] for r in records} == {"rope", "alibi", "rope → yarn x2"}
    assert {r["multiple"] for r in records} == {1.0, 2.0, 4.0}
    assert all(r["status"] == "ok" and r["ppl"] > 1 for r in records)
    assert "rope → yarn x2" in output and "4× / 1×" in output


def test_rerun_skips_finished_jobs(two_stage: tuple[Path, str], workspace: Path, monkeypatch) -> None:
    out, _ = two_stage
    before = (out / "train/pos=rope/model.safetensors").stat().st_mtime_ns
    code, output = sweep(workspace, monkeypatch, "two", "--out", "two")
    assert code == 0, output
    assert "all 2 job(s) already done" in output and "all 1 job(s) already done" in output
    assert (out / "train/pos=rope/model.safetensors").stat().st_mtime_ns == before


def test_compare_renders_from_directories(two_stage: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = two_stage
    result = runner.invoke(app, ["compare", str(out), "--format", "markdown", "--metric", "bpb"])
    assert result.exit_code == 0, result.output
    assert "| rope → yarn x2 |" in result.output and "Bits per byte" in result.output
    result = runner.invoke(app, ["compare", str(out / "train"), "--baseline", str(out / "train/pos=alibi")])
    assert result.exit_code == 0, result.output
    assert "1.000" in result.output
    result = runner.invoke(app, ["compare", str(out), "--format", "csv", "--out", str(tmp_path)])
    assert result.exit_code == 0
    assert result.output.startswith("label,stage,job")
    assert (tmp_path / "extrapolation.png").is_file()
    result = runner.invoke(app, ["compare", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_compare_also_lists_runs_the_plan_does_not_name(two_stage: tuple[Path, str], tmp_path: Path) -> None:
    # A later sweep into the same --out rewrites sweep.json with its own jobs; an extend output lands next to a job.
    out = tmp_path / "sweep"
    shutil.copytree(two_stage[0], out)
    plan = json.loads((out / "sweep.json").read_text())
    plan["jobs"] = [job for job in plan["jobs"] if job["dir"] != "train/pos=alibi"]
    (out / "sweep.json").write_text(json.dumps(plan))
    shutil.copytree(out / "extend/pos=rope/default", out / "train/pos=rope-yarnx2")
    result = runner.invoke(app, ["compare", str(out), "--format", "markdown"])
    assert result.exit_code == 0, result.output
    labels = [line.split("|")[1].strip() for line in result.output.splitlines() if line.startswith("| ")][1:]
    assert labels == ["rope", "rope → yarn x2", "train/pos=alibi", "train/pos=rope-yarnx2"]


def test_dry_run_runs_nothing_and_rejects_bad_overrides(workspace: Path, monkeypatch) -> None:
    code, output = sweep(workspace, monkeypatch, "two", "--out", "dry", "--dry-run")
    assert code == 0, output
    assert "pos=alibi" in output and "dry run" in output
    assert not (workspace / "dry").exists()
    code, output = sweep(workspace, monkeypatch, "two", "model.n_layr=3", "--dry-run")
    assert code == 2
    assert "unknown config key 'model.n_layr'" in output and "Traceback" not in output
    code, output = sweep(workspace, monkeypatch, "two", "model.n_layr=3", "--out", "bad")
    assert code == 2 and not (workspace / "bad").exists()


def test_failing_job_is_reported_and_others_survive(workspace: Path, monkeypatch) -> None:
    code, output = sweep(workspace, monkeypatch, "one", "pos=alibi", "data.paths=[corpus],[missing]", "--out", "fail")
    assert code == 1
    out = workspace / "fail"
    failed = json.loads((out / "train/data.paths=[missing],pos=alibi/failed.json").read_text())
    assert "missing" in failed["error"]
    assert (out / "train/data.paths=[corpus],pos=alibi/eval/extrapolate.json").is_file()
    assert "[failed]" in output


def test_a_failed_jobs_reason_is_on_stderr(workspace: Path, monkeypatch) -> None:
    """A log may keep only stderr: each failed job's one-line reason is there, not only in the table's notes."""
    monkeypatch.chdir(workspace)
    args = ["sweep", "one", "pos=alibi", "data.paths=[missing]", "--out", "fail-err", "--config-dir", "cfg"]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("job ")]
    assert len(lines) == 1 and "fail-err/train/pos=alibi failed: " in lines[0] and "missing" in lines[0], result.stderr


def test_each_jobs_log_lines_name_the_job(two_stage: tuple[Path, str]) -> None:
    """Parallel jobs' lines interleave in one log: each progress line starts with its job's label."""
    _, output = two_stage
    steps = [ln for ln in output.splitlines() if "step 4/4" in ln]
    assert any(ln.startswith("[pos=rope] ") for ln in steps) and any(ln.startswith("[pos=alibi] ") for ln in steps)
    assert all(ln.startswith("[") for ln in steps), steps


@needs_joblib
def test_joblib_launcher_runs_jobs_in_parallel_processes(workspace: Path, monkeypatch) -> None:
    code, output = sweep(
        workspace, monkeypatch, "one", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "--out", "joblib", "--viz"
    )
    assert code == 0, output
    assert (workspace / "joblib/attention.png").stat().st_size > 0
    for job in ("pos=nope", "pos=alibi"):
        assert (workspace / "joblib/train" / job / "eval/extrapolate.json").is_file()


@needs_submitit
def test_submitit_local_launcher(workspace: Path, monkeypatch) -> None:
    code, output = sweep(
        workspace,
        monkeypatch,
        "one",
        "pos=alibi",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=5",
        "--out",
        "submitit",
    )
    assert code == 0, output
    assert (workspace / "submitit/train/pos=alibi/eval/extrapolate.json").is_file()


def test_jobs_log_to_the_configured_tracker(workspace: Path, monkeypatch) -> None:
    pytest.importorskip("tensorboard")
    code, output = sweep(workspace, monkeypatch, "one", "pos=alibi", "train.logger=tensorboard", "--out", "tb")
    assert code == 0, output
    events = list((workspace / "tb/train/pos=alibi").rglob("events.out.tfevents.*"))
    assert events, "the job wrote no TensorBoard event file"


def test_passkey_job_is_done_only_after_both_evaluations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both evaluations run on one loaded model, the passkey one first; neither marks the job done."""
    import posenc_cli.evaluation.runs
    from posenc_cli.evaluation.tasks.extrapolate import ExtrapolateTask
    from posenc_cli.evaluation.tasks.passkey import PasskeyTask
    from posenc_cli.run.config_compose import compose_config
    from posenc_cli.sweep import job
    from posenc_cli.sweep.markers import job_status

    calls: list[str] = []
    job_dir = tmp_path / "job"

    def extrapolate(*args: object, **kwargs: object) -> dict:
        calls.append("extrapolate")
        (job_dir / "eval").mkdir(parents=True, exist_ok=True)
        (job_dir / "eval" / "extrapolate.json").write_text("{}")
        return {}

    def passkey(*args: object, **kwargs: object) -> None:
        calls.append("passkey")
        raise KeyboardInterrupt  # the job is stopped during the passkey evaluation

    monkeypatch.setattr(ExtrapolateTask, "evaluate_job", classmethod(extrapolate))
    monkeypatch.setattr(PasskeyTask, "evaluate_job", classmethod(passkey))
    loads: list[Path] = []
    monkeypatch.setattr(  # where evaluate_each_run loads each run
        posenc_cli.evaluation.runs, "load_run", lambda path, **k: loads.append(Path(path)) or object()
    )
    job_dir.mkdir()
    (job_dir / "model.safetensors").write_bytes(b"")  # started, not finished
    cfg = compose_config(["data=passkey", "train.device=cpu"])
    with pytest.raises(KeyboardInterrupt):
        job._evaluate_job(cfg, job_dir)
    assert calls == ["passkey"] and job_status(job_dir) == "partial"
    monkeypatch.setattr(PasskeyTask, "evaluate_job", classmethod(lambda *a, **k: calls.append("passkey")))
    job._evaluate_job(cfg, job_dir)
    # evaluated, but done only once run_job writes the job's marker (after training completed and both evaluations)
    assert calls == ["passkey", "passkey", "extrapolate"] and job_status(job_dir) == "partial"
    assert loads == [job_dir, job_dir]  # one load per attempt: both evaluations share the loaded model


def test_an_extend_stage_can_remap_positions_instead_of_scaling(workspace: Path, monkeypatch) -> None:
    """extend.remap=self-extend in a sweep makes the same child as `posenc extend --method self-extend`."""
    code, output = sweep(workspace, monkeypatch, "remap", "--out", "remap")
    assert code == 0, output
    child = workspace / "remap" / "self-extend" / "default" / "default"  # <stage>/<parent job>/<job>
    config = (child / "config.yaml").read_text()
    assert "method: self-extend" in config and "window: 8" in config and "group: 2" in config
    assert (child / "done.json").is_file() and (child / "eval" / "extrapolate.json").is_file()
    records = json.loads((workspace / "remap" / "results.json").read_text())
    assert {r["label"] for r in records} == {
        "rope", "self-extend W=8 G=2", "longrope x2 (searched)", "rerope W=8, no log-n"}  # fmt: skip
    # ReRoPE takes log-n by default (its reference), which extend.remap_logn=false turns off
    rerope = (workspace / "remap" / "rerope" / "default" / "default" / "config.yaml").read_text()
    assert "method: rerope" in rerope and "attn_scale: none" in rerope


def test_an_extend_stage_can_search_longrope_factors(workspace: Path, monkeypatch) -> None:
    """extend.longrope_search=N searches the long factors on the parent (as `extend --longrope --search`), then
    extends with them: the child's config holds the found factors."""
    code, output = sweep(workspace, monkeypatch, "remap", "--out", "remap")
    assert code == 0, output
    child = workspace / "remap" / "longrope" / "default" / "default"
    config = (child / "config.yaml").read_text()
    assert "method: longrope" in config and "long_factor:" in config and "long_factor: null" not in config
    assert (child / "done.json").is_file()
    assert "longrope search" in json.loads((child / "profile.json").read_text())["seconds"]
    # as `extend --search`: the factors file and the scored tokens (the training split, which no evaluation reads)
    assert (child / "longrope_factors.json").is_file()
    assert json.loads((child / "meta.json").read_text())["extend"]["search"]["data"]["split"] == "train"
