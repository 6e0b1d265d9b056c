"""Select stages: a grid per scheme, each scheme's pick by a metric read from its runs, later stages run with it.

Most tests fabricate the grid's run directories (a committed checkpoint whose meta.json holds a validation loss, and
its done marker) instead of training; the last ones run a micro sweep end to end through the CLI.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from sweep_utils import COMMON, MICRO_MODEL
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.errors import ConfigError
from posenc_cli.run.journal import commit_checkpoint
from posenc_cli.sweep import runner as sweep_runner
from posenc_cli.sweep.gating import RunGate
from posenc_cli.sweep.identity import read_planned
from posenc_cli.sweep.markers import mark_done, record_failure
from posenc_cli.sweep.plan import (
    StagePlan,
    check_planned,
    plan_identities,
    plan_sweep,
    read_plan,
    validate_plan,
)
from posenc_cli.sweep.select import (
    PICK_FILE,
    Pick,
    SelectionPending,
    make_pick,
    read_pick,
    read_val_loss,
    write_pick,
)
from posenc_cli.sweep.spec import SelectSpec, SweepSpec, load_sweep_spec

GRID = """
overrides: [model=tiny, train.steps=5, train.lr=0.01]
stages:
  - name: grid
    action: select
    params: {pos: "rope,alibi", train.lr: "1e-3,3e-3", train.weight_decay: "0,0.1"}
  - name: seeds
    after: grid
    params: {train.seed: "0,1"}
  - name: yarn
    action: extend
    parent: seeds/pos=rope
    overrides: [extend.method=yarn, extend.factor=2]
"""


SELECT = f"""# posenc sweep select --config-dir DIR
overrides: {COMMON}
stages:
  - name: grid
    action: select
    params: {{pos: "nope,alibi", train.lr: "1e-3,3e-3"}}
    select: {{metric: val_loss}}
  - name: seeds
    after: grid
    params: {{train.seed: "1"}}
"""


def write(tmp_path: Path, text: str, name: str = "mine") -> Path:
    (tmp_path / "sweep").mkdir(exist_ok=True)
    path = tmp_path / "sweep" / f"{name}.yaml"
    path.write_text(text)
    return path


def finish(job_dir: Path, val_loss: float | None) -> None:
    """A finished job as a sweep leaves it: a complete checkpoint (meta.json with its final val_loss), marked done."""
    meta = {"kind": "posenc-run", "schema_version": 1, "steps": 4, "status": "complete", "step": 4}
    commit_checkpoint(job_dir, {"model.safetensors": b"w"}, {**meta, "val_loss": val_loss})
    mark_done(job_dir, job_dir.name)


def plans_of(tmp_path: Path, text: str = GRID, overrides: list[str] | None = None) -> list[StagePlan]:
    return plan_sweep(load_sweep_spec(write(tmp_path, text)), overrides or [])


def run_grid(plan: StagePlan, sweep_dir: Path, losses: dict[str, float | None]) -> None:
    """Finish the grid's jobs named in `losses` (by job name) with those validation losses."""
    for job in plan.jobs:
        if job.name in losses:
            finish(job.dir(sweep_dir), losses[job.name])


def grid_losses(rope: list[float], alibi: list[float]) -> dict[str, float | None]:
    """Job name -> loss, in the grid's order (lr 0.001 wd 0, lr 0.001 wd 0.1, lr 0.003 wd 0, lr 0.003 wd 0.1)."""
    settings = [(lr, wd) for lr in ("0.001", "0.003") for wd in ("0", "0.1")]
    out: dict[str, float | None] = {}
    for pos, values in (("rope", rope), ("alibi", alibi)):
        for (lr, wd), value in zip(settings, values, strict=True):
            out[f"pos={pos},train.lr={lr},train.weight_decay={wd}"] = value
    return out


# ----------------------------------------------------------------------------------------------------------------
# Parsing


def test_a_select_stage_parses_with_its_defaults(tmp_path: Path) -> None:
    spec = load_sweep_spec(write(tmp_path, GRID))
    grid, seeds, yarn = spec.stages
    assert grid.action == "select" and grid.select == SelectSpec(metric="val_loss", group_by=("pos",), partial=False)
    assert seeds.after == "grid" and seeds.select is None and yarn.after is None
    text = GRID.replace("    params: {pos:", "    group_by: [pos, data.task]\n    select: {metric: competence, "
                        "task: copy, partial: true}\n    params: {pos:")  # fmt: skip
    rule = load_sweep_spec(write(tmp_path, text)).stages[0].select
    assert rule == SelectSpec(metric="competence", group_by=("pos", "data.task"), partial=True, task="copy")


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ("[{name: a, action: select, select: {metric: val_los}}]", "did you mean val_loss"),
        ("[{name: a, action: select, select: {metric: competence}}]", "needs select.task"),
        ("[{name: a, action: select, select: {metrc: val_loss}}]", "unknown select key 'metrc'"),
        (
            "[{name: a, action: select, select: {metric: competence, task: tasks, scoring: ruler}}]",
            "select.scoring 'ruler'",
        ),
        ("[{name: a, action: select, select: {partial: maybe}}]", "partial must be true or false"),
        ("[{name: a, action: select, group_by: [1]}]", "group_by must be a key or a list"),
        ("[{name: a, group_by: pos}]", "'group_by' belongs to a select stage"),
        ("[{name: a, action: select}, {name: b, after: c}]", "'c' is not an earlier select stage"),
        ("[{name: a}, {name: b, after: a}]", "'a' is not an earlier select stage"),
        ("[{name: b, after: a}, {name: a, action: select}]", "none"),
        ("[{name: a, action: select}, {name: b, action: extend, parent: a/pos=rope, after: a}]", "for a train stage"),
    ],
)
def test_malformed_select_stages_are_refused_in_one_line(tmp_path: Path, stages: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        load_sweep_spec(write(tmp_path, f"stages: {stages}\n"))
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------------------------------
# Planning


def test_a_later_stage_awaits_the_pick_and_runs_once_per_scheme_of_the_grid(tmp_path: Path) -> None:
    grid, seeds, yarn = plans_of(tmp_path)
    assert len(grid.jobs) == 8 and grid.chosen == ["train.lr", "train.weight_decay"] and grid.awaiting is None
    assert {j.label for j in grid.jobs} >= {"rope, lr=0.001, weight_decay=0", "alibi, lr=0.003, weight_decay=0.1"}
    # The seeds stage does not name pos: it runs for each scheme of the grid; the pick is not made yet.
    assert seeds.awaiting == "grid" and not any(j.resolved for j in seeds.jobs)
    assert sorted(j.name for j in seeds.jobs) == sorted(
        f"pos={p},train.seed={s}" for p in ("rope", "alibi") for s in (0, 1)
    )
    assert {j.label for j in seeds.jobs} == {"rope", "alibi"}
    assert all("train.lr=0.01" not in j.overrides for j in seeds.jobs)  # the global value is the pick's to replace
    with pytest.raises(RuntimeError, match="awaits the pick of stage grid"):
        seeds.jobs[0].dir(tmp_path)
    # An extend stage of the awaiting runs awaits too.
    assert yarn.awaiting == "grid" and yarn.jobs == []


def test_later_jobs_run_with_their_schemes_pick_in_a_directory_named_by_it(tmp_path: Path) -> None:
    spec = load_sweep_spec(write(tmp_path, GRID))
    grid = plan_sweep(spec, [])[0]
    run_grid(grid, tmp_path, grid_losses(rope=[3.0, 2.0, 2.5, 2.6], alibi=[1.5, 1.6, 1.7, 1.4]))
    pick = make_pick("grid", grid.stage.select, grid.jobs, grid.chosen, tmp_path)
    assert pick.lines(("rope",)) == ["train.lr=0.001", "train.weight_decay=0.1"]
    assert pick.lines(("alibi",)) == ["train.lr=0.003", "train.weight_decay=0.1"]
    _, seeds, yarn = plan_sweep(spec, [], {"grid": pick})
    assert seeds.awaiting is None and yarn.awaiting is None
    by_name = {j.name: j for j in seeds.jobs}
    rope = by_name["pos=rope,train.seed=1"]
    assert rope.picked == ["train.lr=0.001", "train.weight_decay=0.1"]
    assert rope.dir(tmp_path) == tmp_path / "seeds/train.lr=0.001,train.weight_decay=0.1/pos=rope,train.seed=1"
    assert [o for o in rope.overrides if o.startswith("train.lr")] == ["train.lr=0.001"]  # the pick, once
    alibi = by_name["pos=alibi,train.seed=0"]
    assert alibi.dir(tmp_path).parent.name == "train.lr=0.003,train.weight_decay=0.1"
    # The extend stage derives from the rope seeds, in their picked directories.
    assert {j.parent for j in yarn.jobs} == {
        "seeds/train.lr=0.001,train.weight_decay=0.1/pos=rope,train.seed=0",
        "seeds/train.lr=0.001,train.weight_decay=0.1/pos=rope,train.seed=1",
    }
    assert yarn.jobs[0].dir(tmp_path).is_relative_to(tmp_path / "yarn/train.lr=0.001,train.weight_decay=0.1")


def test_a_changed_pick_plans_new_later_jobs_instead_of_reusing_the_old_ones(tmp_path: Path) -> None:
    text = GRID.replace('"rope,alibi"', "rope").replace('train.weight_decay: "0,0.1"', "train.weight_decay: 0")
    text = text.replace('"0,1"', "0")
    spec = load_sweep_spec(write(tmp_path, text))
    grid = plan_sweep(spec, [])[0]
    run_grid(grid, tmp_path, {"train.lr=0.001": 2.0, "train.lr=0.003": 2.5})
    first = make_pick("grid", grid.stage.select, grid.jobs, grid.chosen, tmp_path)
    plans = plan_sweep(spec, [], {"grid": first})
    identities = plan_identities(plans, validate_plan(plans, None))
    old_job = plans[1].jobs[0]
    finish(old_job.dir(tmp_path), 2.0)  # the later job ran with the first pick
    # The lr=0.003 point is re-run and now wins: the later job is another job, in another directory.
    finish(grid.jobs[1].dir(tmp_path), 1.0)
    second = make_pick("grid", grid.stage.select, grid.jobs, grid.chosen, tmp_path)
    replanned = plan_sweep(spec, [], {"grid": second})
    new_identities = plan_identities(replanned, validate_plan(replanned, None))
    new_job = replanned[1].jobs[0]
    assert new_job.name == old_job.name and new_job.key != old_job.key
    assert new_identities[new_job.key]["train.lr"] == 0.003 and identities[old_job.key]["train.lr"] == 0.001
    check_planned(tmp_path, replanned, new_identities)  # no refusal: nothing of the new job's was run yet


def test_the_later_stage_cannot_set_what_the_pick_chooses_nor_run_a_scheme_without_a_grid(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"train.lr is chosen by stage grid's pick"):
        plans_of(tmp_path, GRID.replace('params: {train.seed: "0,1"}', 'params: {train.seed: "0,1", train.lr: 1}'))
    with pytest.raises(ConfigError, match=r"pos=nope\) has no grid in stage grid to pick from"):
        plans_of(tmp_path, GRID.replace('params: {train.seed: "0,1"}', 'params: {pos: "rope,nope"}'))
    with pytest.raises(ConfigError, match="trains its grid on one seed; train.seed is swept"):
        plans_of(tmp_path, GRID.replace('train.weight_decay: "0,0.1"', 'train.seed: "0,1"'))
    # A later stage may name a subset of the schemes.
    seeds = plans_of(tmp_path, GRID.replace('params: {train.seed: "0,1"}', "params: {pos: alibi}"))[1]
    assert [j.name for j in seeds.jobs] == ["default"] and seeds.awaiting == "grid"


# ----------------------------------------------------------------------------------------------------------------
# The pick


def test_the_lowest_validation_loss_is_picked_per_scheme_ties_to_the_first_and_nan_never(tmp_path: Path) -> None:
    grid = plans_of(tmp_path)[0]
    run_grid(grid, tmp_path, grid_losses(rope=[math.nan, 2.0, 2.0, 2.5], alibi=[math.inf, math.nan, 9.0, 8.0]))
    job = grid.jobs[1]
    assert read_val_loss(job.dir(tmp_path)) == 2.0
    pick = make_pick("grid", grid.stage.select, grid.jobs, grid.chosen, tmp_path)
    assert pick.lines(("rope",)) == ["train.lr=0.001", "train.weight_decay=0.1"]  # 2.0 twice: the first in order
    assert pick.lines(("alibi",)) == ["train.lr=0.003", "train.weight_decay=0.1"]
    path = write_pick(tmp_path, pick)
    assert path == tmp_path / "grid" / PICK_FILE
    doc = json.loads(path.read_text())
    assert doc == read_pick(tmp_path, "grid")
    assert (doc["metric"], doc["goal"], doc["group_by"], doc["chosen"]) == (
        "val_loss",
        "min",
        ["pos"],
        ["train.lr", "train.weight_decay"],
    )
    rope = doc["groups"][0]
    assert rope["group"] == {"pos": "rope"} and rope["value"] == 2.0
    assert rope["picked"] == {"train.lr": "0.001", "train.weight_decay": "0.1"}
    assert rope["run"] == "grid/pos=rope,train.lr=0.001,train.weight_decay=0.1"
    assert [p["value"] for p in rope["points"]] == [None, 2.0, 2.0, 2.5]  # every grid point, non-finite as null
    assert rope["points"][0] == {
        "run": "grid/pos=rope,train.lr=0.001,train.weight_decay=0",
        "setting": {"train.lr": "0.001", "train.weight_decay": "0"},
        "status": "done",
        "value": None,
        "note": "non-finite",
    }


def test_competence_is_maximised(tmp_path: Path) -> None:
    grid = plans_of(tmp_path)[0]
    run_grid(grid, tmp_path, grid_losses(rope=[1, 1, 1, 1], alibi=[1, 1, 1, 1]))
    accuracy = {j.dir(tmp_path): a for j, a in zip(grid.jobs, [0.1, 0.9, 0.95, 0.95, 0.5, 0.2, 0.4, 0.3], strict=True)}
    rule = SelectSpec(metric="competence", task="copy")
    pick = make_pick("grid", rule, grid.jobs, grid.chosen, tmp_path, read=accuracy.get)
    assert pick.goal == "max"
    assert pick.lines(("rope",)) == ["train.lr=0.003", "train.weight_decay=0"]
    assert pick.lines(("alibi",)) == ["train.lr=0.001", "train.weight_decay=0"]


def test_competence_is_read_through_evaluation_competence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc_cli.evaluation import competence as gate

    grid = plans_of(tmp_path)[0]
    run_grid(grid, tmp_path, grid_losses(rope=[1, 1, 1, 1], alibi=[1, 1, 1, 1]))
    rule = SelectSpec(metric="competence", task="copy", scoring="exact")
    # Runs without a stored evaluation of the task: not measured, so nothing is picked.
    with pytest.raises(SelectionPending, match=r"8 of 8 grid points have no competence \(grid/.*: not measured"):
        make_pick("grid", rule, grid.jobs, grid.chosen, tmp_path)
    asked: list[tuple[Path, str, str]] = []

    def measured(run_dir: Path, task: str, scoring: str = "contains") -> float:
        asked.append((Path(run_dir), task, scoring))
        return 0.5 + 0.01 * len(asked)

    monkeypatch.setattr(gate, "competence", measured)
    pick = make_pick("grid", rule, grid.jobs, grid.chosen, tmp_path)
    assert asked[0] == (grid.jobs[0].dir(tmp_path), "copy", "exact") and len(asked) == 8
    assert pick.lines(("rope",)) == ["train.lr=0.003", "train.weight_decay=0.1"]  # the 4th read is rope's highest
    assert pick.to_json()["task"] == "copy" and pick.to_json()["goal"] == "max"


def test_an_unfinished_grid_is_not_picked_unless_the_stage_says_partial(tmp_path: Path) -> None:
    grid = plans_of(tmp_path)[0]
    losses = grid_losses(rope=[3.0, 2.0, 2.5, 2.6], alibi=[1.5, 1.6, 1.7, 1.4])
    failed = "pos=alibi,train.lr=0.003,train.weight_decay=0.1"
    run_grid(grid, tmp_path, {k: v for k, v in losses.items() if k != failed and "rope,train.lr=0.003" not in k})
    record_failure(tmp_path / "grid" / failed, failed, "boom")
    with pytest.raises(SelectionPending) as e:
        make_pick("grid", grid.stage.select, grid.jobs, grid.chosen, tmp_path)
    message = str(e.value)
    assert "\n" not in message and "3 of 8 grid points have no val_loss" in message
    assert "grid/pos=rope,train.lr=0.003,train.weight_decay=0: not run" in message
    assert f"grid/{failed}: failed" in message and "select.partial: true" in message
    rule = SelectSpec(partial=True)
    pick = make_pick("grid", rule, grid.jobs, grid.chosen, tmp_path)
    assert pick.lines(("rope",)) == ["train.lr=0.001", "train.weight_decay=0.1"]
    assert pick.lines(("alibi",)) == ["train.lr=0.001", "train.weight_decay=0"]  # 1.4 did not finish
    # partial picks among finished points only: a scheme with none still waits.
    for job in grid.jobs[:4]:
        (job.dir(tmp_path) / "done.json").unlink(missing_ok=True)
    with pytest.raises(SelectionPending, match="cannot pick for pos=rope: no grid point finished"):
        make_pick("grid", rule, grid.jobs, grid.chosen, tmp_path)


# ----------------------------------------------------------------------------------------------------------------
# The runner: pick after the grid ran, plan the later stages with it; resume


@pytest.mark.integration  # a sweep run
def test_the_sweep_waits_for_the_grid_then_runs_the_later_stage_with_the_pick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = GRID.replace('train.weight_decay: "0,0.1"', "train.weight_decay: 0").replace('"0,1"', "0")
    spec = load_sweep_spec(write(tmp_path, text))
    sweep_dir = tmp_path / "out"
    ran: list[tuple[str, list[str]]] = []

    def fake_stage(plan: StagePlan, sweep_dir: Path, *args: object) -> None:  # records what would run
        ran.append((plan.stage.name, [j.key for j in plan.jobs]))

    monkeypatch.setattr(sweep_runner, "_run_stage", fake_stage)
    events: list[str] = []
    say = lambda kind, text: events.append(f"{kind} {text}")  # noqa: E731
    grid = plan_sweep(spec, [])[0]
    losses = {"pos=rope,train.lr=0.001": 2.0, "pos=rope,train.lr=0.003": 1.0, "pos=alibi,train.lr=0.001": 1.0}
    run_grid(grid, sweep_dir, losses)  # alibi at lr 0.003 did not finish
    with pytest.raises(SelectionPending, match="1 of 4 grid points"):
        sweep_runner.run_sweep(spec, [], sweep_dir, on_event=say)
    assert [name for name, _ in ran] == ["grid"]  # the later stages never started
    assert not (sweep_dir / "grid" / PICK_FILE).exists()
    assert {job["stage"] for job in read_plan(sweep_dir)["jobs"]} == {"grid"}  # only jobs with a directory

    run_grid(grid, sweep_dir, {"pos=alibi,train.lr=0.003": 1.5})
    ran.clear()
    plans = sweep_runner.run_sweep(spec, [], sweep_dir, on_event=say)
    assert ran == [
        ("grid", [j.key for j in grid.jobs]),
        ("seeds", ["seeds/train.lr=0.003/pos=rope", "seeds/train.lr=0.001/pos=alibi"]),
        ("yarn", ["yarn/train.lr=0.003/pos=rope/default"]),
    ]
    assert [p.awaiting for p in plans] == [None, None, None]
    doc = read_pick(sweep_dir, "grid")
    assert doc is not None and [g["picked"] for g in doc["groups"]] == [{"train.lr": "0.003"}, {"train.lr": "0.001"}]
    assert "pick stage grid: pos=rope: train.lr=0.003 (val_loss 1)" in events
    recorded = {job["dir"]: job for job in read_plan(sweep_dir)["jobs"]}
    assert recorded["seeds/train.lr=0.003/pos=rope"]["picked"] == ["train.lr=0.003"]
    planned = read_planned(sweep_dir)
    assert planned["seeds/train.lr=0.001/pos=alibi"]["config"]["train.lr"] == 0.001
    # Each pick is its own multirun, fixed (out of the directory names), its schemes swept.
    launches = sweep_runner._launches(plans[1])
    assert [(la.swept["pos"], la.fixed[-1]) for la in launches] == [
        (["rope"], "train.lr=0.003"),
        (["alibi"], "train.lr=0.001"),
    ]
    assert all("train.lr" in la.fixed_keys and "train.lr=0.01" not in la.fixed for la in launches)
    # Schemes with the same pick share one multirun, so that its launcher runs their jobs in parallel.
    same = dataclasses.replace(
        plans[1], jobs=[dataclasses.replace(j, picked=["train.lr=0.003"]) for j in plans[1].jobs]
    )
    (merged,) = sweep_runner._launches(same)
    assert merged.swept["pos"] == ["rope", "alibi"] and merged.fixed[-1] == "train.lr=0.003"
    assert [j.key for j in merged.jobs] == [j.key for j in same.jobs]
    assert (
        planned["yarn/train.lr=0.003/pos=rope/default"]["config"]["parent.config_hash"]
        == (planned["seeds/train.lr=0.003/pos=rope"]["config_hash"])
    )


# ----------------------------------------------------------------------------------------------------------------
# End to end, through the CLI, with a micro model


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("select")
    (root / "corpus").mkdir()
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda"]
    for i in range(6):
        (root / "corpus" / f"doc{i}.txt").write_text(" ".join(words[(i * 7 + j * j) % len(words)] for j in range(600)))
    (root / "cfg" / "model").mkdir(parents=True)
    (root / "cfg" / "sweep").mkdir()
    (root / "cfg" / "model" / "micro.yaml").write_text(MICRO_MODEL)
    (root / "cfg" / "sweep" / "select.yaml").write_text(SELECT)
    return root


def sweep(workspace: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    monkeypatch.chdir(workspace)
    result = CliRunner().invoke(app, ["sweep", *args, "--config-dir", str(workspace / "cfg")], terminal_width=200)
    return result.exit_code, result.output


@pytest.mark.integration
def test_a_select_sweep_end_to_end_then_resumed(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, output = sweep(workspace, monkeypatch, "select", "--dry-run")
    assert code == 0, output
    assert "picks:     train.lr per pos, by the lowest val_loss" in output
    assert "the pick of stage grid (its grid has not run)" in output and "(awaits the pick)" in output

    code, output = sweep(workspace, monkeypatch, "select", "--out", "s")
    assert code == 0, output
    out = workspace / "s"
    doc = json.loads((out / "grid" / PICK_FILE).read_text())
    picks = {g["group"]["pos"]: g["picked"]["train.lr"] for g in doc["groups"]}
    assert set(picks) == {"nope", "alibi"}
    for group in doc["groups"]:  # the pick is the lowest final validation loss of the scheme's grid
        values = [p["value"] for p in group["points"]]
        assert group["value"] == min(values) and all(isinstance(v, float) for v in values)
        run = out / group["run"]
        assert json.loads((run / "meta.json").read_text())["val_loss"] == group["value"]
    for pos, lr in picks.items():
        job = out / "seeds" / f"train.lr={lr}" / f"pos={pos}"
        assert (job / "done.json").is_file(), job
        config = (job / "config.yaml").read_text()
        assert f"lr: {lr}" in config and "seed: 1" in config
    assert "picked by stage grid (val_loss, lowest):" in output
    assert f"pos=nope: train.lr={picks['nope']} (val_loss" in output and "best of 2)" in output
    records = {r["label"] for r in json.loads((out / "results.json").read_text())}
    assert {"nope", "alibi", "nope, lr=0.001", "alibi, lr=0.003"} <= records

    # Resumed: nothing re-runs, the pick is made again from the finished grid, and the dry run shows it.
    code, again = sweep(workspace, monkeypatch, "select", "--out", "s")
    assert code == 0, again
    assert "stage grid: all 4 job(s) already done" in again, again
    launches = 1 if picks["nope"] == picks["alibi"] else 2  # schemes with the same pick share one multirun
    assert again.count(f"all {2 // launches} job(s) already done") == launches, again
    assert json.loads((out / "grid" / PICK_FILE).read_text()) == doc
    code, dry = sweep(workspace, monkeypatch, "select", "--out", "s", "--dry-run")
    assert code == 0, dry
    assert f"train.lr={picks['alibi']}" in dry and "(awaits the pick)" not in dry


@pytest.mark.integration  # a sweep run
def test_a_grid_that_cannot_be_picked_from_stops_the_sweep_saying_how_to_resume(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workspace)
    args = ["sweep", "select", "data.paths=[missing]", "--out", "pending", "--config-dir", "cfg"]
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if "cannot pick" in ln]
    assert len(lines) == 1, result.stderr
    assert (
        "stage grid cannot pick yet: 4 of 4 grid points have no val_loss (grid/pos=nope,train.lr=0.001: failed"
        in lines[0]
    )
    assert lines[0].endswith("Resume with: posenc sweep select 'data.paths=[missing]' --out pending --config-dir cfg")
    assert not (workspace / "pending" / "seeds").exists() and not (workspace / "pending" / "grid" / PICK_FILE).exists()


def test_competence_ties_go_to_the_lower_validation_loss(tmp_path: Path) -> None:
    """Accuracy ties often (every point at 0% when none learned, several at 100%): the lower val_loss decides."""
    grid = plans_of(tmp_path)[0]
    run_grid(grid, tmp_path, grid_losses(rope=[1.5, 1.2, 1.4, 1.3], alibi=[0.3, 0.1, 0.2, 0.2]))
    accuracy = {j.dir(tmp_path): a for j, a in zip(grid.jobs, [0.0, 0.0, 0.0, 0.0, 1.0, 0.5, 1.0, 1.0], strict=True)}
    rule = SelectSpec(metric="competence", task="copy")
    pick = make_pick("grid", rule, grid.jobs, grid.chosen, tmp_path, read=accuracy.get)
    assert pick.lines(("rope",)) == ["train.lr=0.001", "train.weight_decay=0.1"]  # all 0%: val_loss 1.2
    assert pick.lines(("alibi",)) == ["train.lr=0.003", "train.weight_decay=0"]  # 100% thrice: 0.2 twice, the first
    assert "val_loss" in pick.to_json()["tie_break"]


# ----------------------------------------------------------------------------------------------------------------
# learned_only: seeds only for the rows that learned (issue #44); not_learned_only: twice the steps only for the rows
# still below the gate (issue #38)

LEARNED_ONLY = GRID.replace(
    "    params: {pos: ", "    select: {metric: competence, task: copy}\n    params: {pos: "
).replace("    after: grid\n", "    after: grid\n    learned_only: true\n")
NOT_LEARNED_ONLY = LEARNED_ONLY.replace("learned_only: true", "not_learned_only: true")


def _gated_pick(tmp_path: Path, spec: SweepSpec) -> Pick:
    """rope's best 0.9 (the gate, >=), alibi's best 0.89."""
    grid = plan_sweep(spec, [])[0]
    run_grid(grid, tmp_path, grid_losses(rope=[1, 1, 1, 1], alibi=[1, 1, 1, 1]))
    accuracy = {j.dir(tmp_path): a for j, a in zip(grid.jobs, [0.1, 0.9, 0.5, 0.5, 0.89, 0.2, 0.4, 0.3], strict=True)}
    return make_pick("grid", grid.stage.select, grid.jobs, grid.chosen, tmp_path, read=accuracy.get)


def test_a_learned_only_stage_runs_only_the_groups_whose_pick_passed_the_gate(tmp_path: Path) -> None:
    spec = load_sweep_spec(write(tmp_path, LEARNED_ONLY))
    assert spec.stages[1].runs_for == "learned" and spec.stages[2].runs_for is None
    seeds = plan_sweep(spec, [])[1]
    assert seeds.awaiting == "grid" and len(seeds.jobs) == 4 and seeds.left_out == {}  # unknown until the pick
    pick = _gated_pick(tmp_path, spec)
    _, seeds, yarn = plan_sweep(spec, [], {"grid": pick})
    assert sorted(j.name for j in seeds.jobs) == ["pos=rope,train.seed=0", "pos=rope,train.seed=1"]
    assert {group: v.accuracy for group, v in seeds.left_out.items()} == {"pos=alibi": pytest.approx(0.89)}
    assert len(yarn.jobs) == 2  # the rope seeds it derives from are still planned
    # Without learned_only the same pick plans every group.
    plain = load_sweep_spec(write(tmp_path, LEARNED_ONLY.replace("    learned_only: true\n", "")))
    assert len(plan_sweep(plain, [], {"grid": pick})[1].jobs) == 4


def test_a_not_learned_only_stage_runs_only_the_groups_whose_pick_failed_the_gate(tmp_path: Path) -> None:
    spec = load_sweep_spec(write(tmp_path, NOT_LEARNED_ONLY))
    assert spec.stages[1].runs_for == "not learned"
    pick = _gated_pick(tmp_path, spec)
    _, seeds, yarn = plan_sweep(spec, [], {"grid": pick})
    assert sorted(j.name for j in seeds.jobs) == ["pos=alibi,train.seed=0", "pos=alibi,train.seed=1"]
    assert {group: v.accuracy for group, v in seeds.left_out.items()} == {"pos=rope": pytest.approx(0.9)}
    assert yarn.jobs == []  # its parents are rope's seeds, not planned


def test_a_gated_stage_names_each_group_it_leaves_out_by_the_gate() -> None:
    assert RunGate.of_value(0.6, 0.9).text(0.9) == "not learned (60% < the gate, 90%)"
    assert RunGate.of_value(0.9, 0.9).text(0.9) == "learned (90% >= the gate, 90%)"
    assert RunGate.of_value(0.6, 0.5).text(0.5) == "learned (60% >= the gate, 50%)"
    assert RunGate.of_value(math.nan, 0.9).text(0.9) == "not learned (no score)"
    # the gate's own verdict: a mixture's mean above the gate with one task below it did not learn
    assert RunGate(0.93, False).text(0.9) == "not learned (93% on average, a task below the gate, 90%)"
    assert RunGate(None, False, "not measured").text(0.9) == "not learned (not measured)"


def test_a_gated_stage_compares_each_pick_with_the_sweeps_competence_gate(tmp_path: Path) -> None:
    """`posenc sweep --competence` gates the stages as it gates the tables: at 0.85 alibi's 0.89 passed."""
    spec = load_sweep_spec(write(tmp_path, LEARNED_ONLY))
    pick = _gated_pick(tmp_path, spec)
    seeds = plan_sweep(spec, [], {"grid": pick}, gate=0.85)[1]
    assert len(seeds.jobs) == 4 and seeds.left_out == {}
    seeds = plan_sweep(spec, [], {"grid": pick}, gate=0.95)[1]
    assert seeds.jobs == [] and set(seeds.left_out) == {"pos=rope", "pos=alibi"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GRID.replace("    after: grid\n", "    after: grid\n    learned_only: true\n"), "select.metric competence"),
        (
            GRID.replace("    after: grid\n", "    after: grid\n    not_learned_only: true\n"),
            "select.metric competence",
        ),
        (LEARNED_ONLY.replace("learned_only: true", "learned_only: yes please"), "must be true or false"),
        (NOT_LEARNED_ONLY.replace("not_learned_only: true", "not_learned_only: 1"), "must be true or false"),
        ("stages: [{name: a, learned_only: true}]", "needs after: a select stage"),
        (
            LEARNED_ONLY.replace("learned_only: true", "learned_only: true\n    not_learned_only: true"),
            "exclude each other",
        ),
    ],
)
def test_learned_only_needs_a_stage_after_a_competence_pick(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        load_sweep_spec(write(tmp_path, text))
    assert "\n" not in str(e.value)


@pytest.mark.integration  # a sweep run
def test_the_sweep_runs_a_learned_only_stage_for_the_learned_schemes_and_says_which_it_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = LEARNED_ONLY.replace('train.weight_decay: "0,0.1"', "train.weight_decay: 0")
    spec = load_sweep_spec(write(tmp_path, text))
    sweep_dir = (tmp_path / "out").resolve()
    ran: dict[str, list[str]] = {}
    monkeypatch.setattr(sweep_runner, "_run_stage", lambda plan, *a: ran.update({plan.stage.name: plan.jobs}))
    grid = plan_sweep(spec, [])[0]
    run_grid(grid, sweep_dir, dict.fromkeys((j.name for j in grid.jobs), 1.0))
    # rope learns at lr 0.003 (100%), alibi at best 60%
    accuracy = dict(zip((j.dir(sweep_dir) for j in grid.jobs), [0.95, 1.0, 0.2, 0.6], strict=True))
    events: list[str] = []
    say = lambda kind, text: events.append(f"{kind} {text}")  # noqa: E731
    sweep_runner.run_sweep(spec, [], sweep_dir, on_event=say, read_metric=accuracy.get)
    assert [j.key for j in ran["seeds"]] == [
        "seeds/train.lr=0.003/pos=rope,train.seed=0",
        "seeds/train.lr=0.003/pos=rope,train.seed=1",
    ]
    assert "skip stage seeds: pos=alibi not learned (60% < the gate, 90%): no jobs" in events
    assert {job["stage"] for job in read_plan(sweep_dir)["jobs"] if "pos=alibi" in job["dir"]} == {"grid"}


def _dry_run(plans: list[StagePlan], out: Path) -> str:
    from posenc_cli.cli.app import console
    from posenc_cli.cli.sweep import _print_plan

    with console.capture() as captured:
        _print_plan("mine", plans, out, "basic", {})
    return " ".join(captured.get().split())


@pytest.mark.parametrize(
    ("text", "runs_for", "left_out", "none"),
    [
        (LEARNED_ONLY, "learned", "pos=alibi not learned (60% < the gate, 90%)", "every group failed"),
        (NOT_LEARNED_ONLY, "not learned", "pos=alibi learned (95% >= the gate, 90%)", "every group passed"),
    ],
)
def test_the_dry_run_lists_the_groups_a_gated_stage_leaves_out(
    tmp_path: Path, text: str, runs_for: str, left_out: str, none: str
) -> None:
    spec = load_sweep_spec(write(tmp_path, text.replace('"rope,alibi"', "alibi")))
    before = _dry_run(plan_sweep(spec, []), tmp_path)  # the grid has not run: which groups is not known yet
    passed = "passed" if runs_for == "learned" else "failed"
    assert f"{runs_for} only: the groups whose pick {passed} the gate" in before and "left out" not in before
    grid = plan_sweep(spec, [])[0]
    run_grid(grid, tmp_path, dict.fromkeys((j.name for j in grid.jobs), 1.0))
    best = 0.6 if runs_for == "learned" else 0.95
    accuracy = dict(zip((j.dir(tmp_path) for j in grid.jobs), [0.5, best, 0.2, 0.3], strict=True))
    pick = make_pick("grid", grid.stage.select, grid.jobs, grid.chosen, tmp_path, read=accuracy.get)
    after = _dry_run(plan_sweep(spec, [], {"grid": pick}), tmp_path)
    assert "stage seeds (train, after grid): 0 job(s)" in after
    assert f"{runs_for} only: left out: {left_out}" in after
    seeds = after.split("stage seeds", 1)[1].split("stage yarn", 1)[0]
    assert f"(none) {none} the competence gate" in seeds and "no parent run" not in seeds


def test_the_sweep_command_gates_its_stages_and_its_tables_with_one_competence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--competence` reaches the plan (the gated stages), the resume hint and the report alike."""
    from posenc_cli import api

    seen: dict[str, float] = {}

    def plan(*args: object, **kwargs: object) -> None:
        seen["plan"] = float(kwargs["competence"])  # type: ignore[arg-type]
        raise ConfigError("planned")

    monkeypatch.setattr(api, "plan_sweep", plan)
    result = CliRunner().invoke(app, ["sweep", "select", "--competence", "0.8", "--dry-run"])
    assert result.exit_code == 2 and "planned" in result.output and seen == {"plan": 0.8}
