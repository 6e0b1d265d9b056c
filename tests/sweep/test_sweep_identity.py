"""A sweep job's identity is its resolved config: a re-run into the same --out reuses a job only when it is planned
with the same config, and refuses (one line, exit 2, nothing run) a job directory planned differently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sweep_utils import MICRO_MODEL, ONE_STAGE
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.sweep.identity import PLANNED_FILE

pytestmark = pytest.mark.integration  # end to end (sweeps, launchers, DDP, compile): not in the fast lane

runner = CliRunner()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("identity")
    (root / "corpus").mkdir()
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda"]
    for i in range(6):
        (root / "corpus" / f"doc{i}.txt").write_text(" ".join(words[(i * 7 + j * j) % 11] for j in range(600)))
    (root / "cfg" / "model").mkdir(parents=True)
    (root / "cfg" / "sweep").mkdir()
    (root / "cfg" / "model" / "micro.yaml").write_text(MICRO_MODEL)
    (root / "cfg" / "sweep" / "one.yaml").write_text(ONE_STAGE)
    return root


def sweep(workspace: Path, *args: str) -> tuple[int, str, str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(workspace)
        result = runner.invoke(app, ["sweep", "one", *args, "--config-dir", "cfg"], terminal_width=200)
    err = "\n".join(ln for ln in result.stderr.splitlines() if not ln.startswith("warning: this machine is busy"))
    return result.exit_code, result.stdout, err


@pytest.fixture(scope="module")
def nope_run(workspace: Path) -> Path:
    code, out, err = sweep(workspace, "pos=nope", "--out", "nope")
    assert code == 0, out + err
    return workspace / "nope"


def _snapshot(job_dir: Path) -> bytes:
    return (job_dir / "model.safetensors").read_bytes()


def test_a_scheme_narrowed_on_the_command_line_runs_in_its_own_directory(workspace: Path, nope_run: Path) -> None:
    """`pos=alibi` narrows the stage's pos sweep: its job is train/pos=alibi (as in the full grid), beside NoPE's,
    never in NoPE's directory or under its label (it was train/default for both, refused by the identity check)."""
    before = _snapshot(nope_run / "train/pos=nope")
    code, out, err = sweep(workspace, "pos=alibi", "--out", "nope")
    assert code == 0, out + err
    assert (nope_run / "train/pos=alibi/done.json").is_file()
    assert _snapshot(nope_run / "train/pos=nope") == before


def test_a_changed_fixed_setting_is_refused_not_shown_under_its_label(workspace: Path, nope_run: Path) -> None:
    before = _snapshot(nope_run / "train/pos=nope")
    code, out, err = sweep(workspace, "pos=nope", "train.steps=6", "--out", "nope")
    assert code == 2, out + err  # was: skipped as done, the 4-step model shown for train.steps=6
    assert "was planned with train.steps=4; this sweep asks train.steps=6" in err
    assert "train/pos=nope" in err and "use another --out" in err and len(err.strip().splitlines()) == 1
    assert "already done" not in out and "Traceback" not in out + err
    assert _snapshot(nope_run / "train/pos=nope") == before


def test_the_dry_run_refuses_what_the_run_would(workspace: Path, nope_run: Path) -> None:
    code, out, err = sweep(workspace, "pos=nope", "train.steps=6", "--out", "nope", "--dry-run")
    assert code == 2 and "was planned with train.steps=4; this sweep asks train.steps=6" in err, out + err
    code, out, err = sweep(workspace, "pos=nope", "--out", "nope", "--dry-run")
    assert code == 0 and "dry run" in out, out + err


def test_the_unchanged_rerun_still_skips_and_runtime_settings_do_not_count(workspace: Path, nope_run: Path) -> None:
    code, out, err = sweep(workspace, "pos=nope", "--out", "nope")
    assert code == 0, out + err
    assert "stage train: all 1 job(s) already done" in out
    code, out, err = sweep(workspace, "pos=nope", "train.log_every=1", "--out", "nope")
    assert code == 0 and "already done" in out, out + err


def test_records_planned_with_or_without_train_compile_still_match(workspace: Path, nope_run: Path) -> None:
    """train.compile changes speed and rounding, not what a job measures: a record written before it existed (no
    key) and one written while identities still held it (False) both match, and so does a compiled re-run."""
    import shutil

    path = workspace / "compile-record"
    shutil.copytree(nope_run, path)
    planned = json.loads((path / PLANNED_FILE).read_text())
    for value in ("<absent>", False):
        for job in planned["jobs"].values():
            job["config"].pop("train.compile", None)
            if value is not False:
                continue
            job["config"]["train.compile"] = False
        (path / PLANNED_FILE).write_text(json.dumps(planned))
        code, out, err = sweep(workspace, "pos=nope", "--out", "compile-record")
        assert code == 0 and "already done" in out, (value, out + err)
    code, out, err = sweep(workspace, "pos=nope", "train.compile=true", "--out", "compile-record", "--dry-run")
    assert code == 0, out + err


def test_a_directory_without_the_record_is_checked_through_the_jobs_config(workspace: Path, nope_run: Path) -> None:
    """Sweep directories written before the record: a train job's own config.yaml is compared."""
    import shutil

    legacy = workspace / "legacy"
    shutil.copytree(nope_run, legacy)
    (legacy / PLANNED_FILE).unlink()
    code, out, err = sweep(workspace, "pos=nope", "--out", "legacy")
    assert code == 0 and "already done" in out, out + err
    (legacy / PLANNED_FILE).unlink()
    code, out, err = sweep(workspace, "pos=nope", "train.steps=6", "--out", "legacy")
    assert code == 2 and "was planned with train.steps=4; this sweep asks train.steps=6" in err, out + err


def test_new_jobs_of_a_grown_grid_run_beside_the_old(workspace: Path) -> None:
    code, out, err = sweep(workspace, "pos=nope,alibi", "--out", "grid")
    assert code == 0, out + err
    code, out, err = sweep(workspace, "pos=nope,alibi,rope", "--out", "grid")
    assert code == 0, out + err
    assert "1 of 3 job(s) to run" in out
    planned = json.loads((workspace / "grid" / PLANNED_FILE).read_text())["jobs"]
    assert set(planned) == {"train/pos=nope", "train/pos=alibi", "train/pos=rope"}
    assert planned["train/pos=rope"]["config"]["pos.name"] == "rope"


def test_a_job_that_failed_before_its_run_existed_runs_again_with_new_settings(workspace: Path) -> None:
    code, out, err = sweep(workspace, "pos=alibi", "data.paths=[missing]", "--out", "failed")
    assert code == 1, out + err
    code, out, err = sweep(workspace, "pos=alibi", "--out", "failed")  # the fix: nothing there to reuse
    assert code == 0 and "1 of 1 job(s) to run" in out, out + err


def test_identity_ignores_speed_and_logging_and_names_the_parent() -> None:
    from posenc_cli.run.config_compose import compose_config
    from posenc_cli.sweep.identity import difference, identity_hash, job_identity

    base = job_identity(compose_config(["pos=rope"]))
    faster = job_identity(compose_config(["pos=rope", "train.threads=2", "train.log_every=7", "train.device=cpu"]))
    assert identity_hash(base) == identity_hash(faster)
    assert identity_hash(base) != identity_hash(job_identity(compose_config(["pos=rope", "train.seed=1"])))
    child_a, child_b = job_identity(compose_config([]), "aaaa"), job_identity(compose_config([]), "bbbb")
    assert identity_hash(child_a) != identity_hash(child_b)  # a child of a retrained parent is not its old self
    assert "derived from a parent run planned with another config" in difference(Path("D"), child_a, child_b)


def test_identity_names_the_training_recipe_only_when_it_is_not_the_old_one() -> None:
    """train.loss_on and train.packing at their defaults (what every job did before they existed) leave an identity
    as it was, so sweeps planned before them reuse their jobs; any other value is part of it."""
    from posenc_cli.run.config_compose import compose_config
    from posenc_cli.sweep.identity import identity_hash, job_identity

    base = job_identity(compose_config(["pos=rope"]))
    assert not {"train.loss_on", "train.packing"} & set(base)
    answer = job_identity(compose_config(["pos=rope", "train.loss_on=answer"]))
    packed = job_identity(compose_config(["pos=rope", "train.packing=none"]))
    assert answer["train.loss_on"] == "answer" and packed["train.packing"] == "none"
    assert len({identity_hash(base), identity_hash(answer), identity_hash(packed)}) == 3
