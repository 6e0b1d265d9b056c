"""Gated stages (`learned_only` / `not_learned_only`): the gate's own verdict decides, and with `gate_by` each job
is gated by its own run of an earlier stage (a seed's longer run by that seed's run), not by the pick (issue #38).

The run directories are fabricated (a committed checkpoint and its done marker) and each run's accuracy is given,
as in test_sweep_select.py; the runner's stages are recorded, not trained.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from posenc_cli.errors import ConfigError
from posenc_cli.evaluation import competence as competence_mod
from posenc_cli.evaluation.competence import Competence
from posenc_cli.report.gate import LEARNED, NOT_LEARNED, NOT_MEASURED
from posenc_cli.run.journal import commit_checkpoint
from posenc_cli.sweep import runner as sweep_runner
from posenc_cli.sweep.gating import RunGate, gate_reader, read_gates
from posenc_cli.sweep.markers import job_status, mark_done
from posenc_cli.sweep.plan import StagePlan, plan_sweep
from posenc_cli.sweep.select import Pick, line_value, make_pick
from posenc_cli.sweep.spec import SelectSpec, SweepSpec, load_sweep_spec

GATED = """
overrides: [model=tiny, train.steps=5, train.lr=0.01]
stages:
  - name: grid
    action: select
    select: {metric: competence, task: copy}
    params: {pos: "rope,alibi", train.lr: "1e-3,3e-3"}
  - name: seeds
    after: grid
    params: {train.seed: "0,1,2"}
  - name: long
    after: grid
    not_learned_only: true
    gate_by: seeds
    params: {train.steps: 10, train.seed: "0,1,2"}
"""
# the grid's accuracies, in its order (rope 1e-3, rope 3e-3, alibi 1e-3, alibi 3e-3): rope picks 3e-3, alibi 1e-3
GRID_ACCURACY = [0.5, 1.0, 0.95, 0.2]
# the seeds' accuracies (rope 0, 1, 2, then alibi 0, 1, 2); seed 0 is the picked grid point's
SEED_ACCURACY = [1.0, 0.5, 0.95, 0.95, 0.2, 0.92]


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "sweep").mkdir(exist_ok=True)
    path = tmp_path / "sweep" / "mine.yaml"
    path.write_text(text)
    return path


def finish(job_dir: Path) -> None:
    meta = {"kind": "posenc-run", "schema_version": 1, "steps": 4, "status": "complete", "step": 4, "val_loss": 1.0}
    commit_checkpoint(job_dir, {"model.safetensors": b"w"}, meta)
    mark_done(job_dir, job_dir.name)


def picked(tmp_path: Path, spec: SweepSpec) -> Pick:
    grid = plan_sweep(spec, [])[0]
    for job in grid.jobs:
        finish(job.dir(tmp_path))
    accuracy = dict(zip((j.dir(tmp_path) for j in grid.jobs), GRID_ACCURACY, strict=True))
    assert grid.stage.select is not None
    return make_pick("grid", grid.stage.select, grid.jobs, grid.chosen, tmp_path, read=accuracy.get)


def verdicts(seeds: StagePlan, accuracies: list[float], gate: float = 0.9) -> dict[str, RunGate]:
    return {j.key: RunGate.of_value(a, gate) for j, a in zip(seeds.jobs, accuracies, strict=True)}


# ----------------------------------------------------------------------------------------------------------------
# Parsing


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GATED.replace("    not_learned_only: true\n", ""), "gate_by needs learned_only: true or not_learned_only"),
        (GATED.replace("gate_by: seeds", "gate_by: grid"), "'grid' is not an earlier train stage with after: grid"),
        (GATED.replace("gate_by: seeds", "gate_by: seed"), r"did you mean seeds\?"),
        (GATED.replace("gate_by: seeds", "gate_by: long"), "is not an earlier train stage"),
        (GATED.replace("  - name: seeds\n    after: grid\n", "  - name: seeds\n"), "(those: none)"),
    ],
)
def test_gate_by_names_an_earlier_train_stage_after_the_same_grid(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        load_sweep_spec(write(tmp_path, text))
    assert "\n" not in str(e.value)


def test_a_job_without_its_own_run_in_the_gating_stage_is_refused_before_the_grid_runs(tmp_path: Path) -> None:
    spec = load_sweep_spec(write(tmp_path, GATED.replace('{train.steps: 10, train.seed: "0,1,2"}', "{train.seed: 3}")))
    with pytest.raises(ConfigError, match="job pos=rope has no run of stage seeds to be gated by") as e:
        plan_sweep(spec, [])
    assert "train.seed=0,1,2" in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------------------------------
# Planning


def test_a_gate_by_stage_awaits_its_runs_then_runs_each_seed_whose_own_run_did_not_learn(tmp_path: Path) -> None:
    spec = load_sweep_spec(write(tmp_path, GATED))
    assert spec.stages[2].gate_by == "seeds" and spec.stages[2].runs_for == "not learned"
    long = plan_sweep(spec, [])[2]
    assert long.awaiting == "grid" and long.awaiting_runs is None and long.waits
    pick = picked(tmp_path, spec)
    _, seeds, long = plan_sweep(spec, [], {"grid": pick})
    assert long.awaiting is None and long.awaiting_runs == "seeds" and long.waits and len(long.jobs) == 6
    gates = verdicts(seeds, SEED_ACCURACY)
    _, _, long = plan_sweep(spec, [], {"grid": pick}, gates=gates)
    assert not long.waits
    assert [j.key for j in long.jobs] == [
        "long/train.lr=0.003/pos=rope,train.seed=1",
        "long/train.lr=0.001/pos=alibi,train.seed=1",
    ]
    assert all(line_value(j.overrides, "train.steps") == "10" for j in long.jobs)
    assert {run: v.accuracy for run, v in long.left_out.items()} == {
        "pos=rope train.seed=0": 1.0,
        "pos=rope train.seed=2": 0.95,
        "pos=alibi train.seed=0": 0.95,
        "pos=alibi train.seed=2": 0.92,
    }
    # One verdict missing (a seed still to run): the stage awaits the runs.
    del gates["seeds/train.lr=0.001/pos=alibi,train.seed=2"]
    assert plan_sweep(spec, [], {"grid": pick}, gates=gates)[2].awaiting_runs == "seeds"


def test_learned_only_with_gate_by_keeps_the_seeds_that_learned(tmp_path: Path) -> None:
    spec = load_sweep_spec(write(tmp_path, GATED.replace("not_learned_only", "learned_only")))
    pick = picked(tmp_path, spec)
    seeds = plan_sweep(spec, [], {"grid": pick})[1]
    long = plan_sweep(spec, [], {"grid": pick}, gates=verdicts(seeds, SEED_ACCURACY))[2]
    assert [j.name for j in long.jobs] == [
        "pos=rope,train.seed=0",
        "pos=rope,train.seed=2",
        "pos=alibi,train.seed=0",
        "pos=alibi,train.seed=2",
    ]


def test_a_pick_is_gated_by_the_gates_verdict_not_by_its_mean_against_the_threshold(tmp_path: Path) -> None:
    """A mixture's mean of 95% with one task below the gate is "not learned" (the tables say so): a
    not_learned_only stage gated by the pick trains it, where comparing the mean with 90% left it out."""
    spec = load_sweep_spec(write(tmp_path, GATED.replace("    gate_by: seeds\n", "")))
    pick = picked(tmp_path, spec)
    alibi = pick.chosen_points[("alibi",)]
    assert alibi.value == pytest.approx(0.95)
    assert [j.name for j in plan_sweep(spec, [], {"grid": pick})[2].jobs] == []  # by value: both learned
    gates = {alibi.run: RunGate(0.95, False)}
    long = plan_sweep(spec, [], {"grid": pick}, gates=gates)[2]
    assert [j.name for j in long.jobs] == ["pos=alibi,train.seed=0", "pos=alibi,train.seed=1", "pos=alibi,train.seed=2"]
    assert long.left_out["pos=rope"].learned


# ----------------------------------------------------------------------------------------------------------------
# The verdicts, read from the runs


def test_the_verdict_is_the_gates_own_for_a_mixture_and_a_run_that_did_not_finish_did_not_learn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = {
        "mean": Competence("tasks", NOT_LEARNED, 0.95, 0.9),  # four tasks at 100%, one at 75%
        "all": Competence("tasks", LEARNED, 0.98, 0.9),
        "none": Competence("tasks", NOT_MEASURED, None, 0.9),
    }
    monkeypatch.setattr(competence_mod, "assess_run", lambda run_dir, task, gate, scoring: found[Path(run_dir).name])
    for name in found:
        finish(tmp_path / name)
    judge = gate_reader(SelectSpec(metric="competence", task="tasks"), 0.9)
    assert judge(tmp_path / "mean") == RunGate(0.95, False)
    assert judge(tmp_path / "mean").text(0.9) == "not learned (95% on average, a task below the gate, 90%)"
    assert judge(tmp_path / "all") == RunGate(0.98, True)
    assert judge(tmp_path / "none").text(0.9) == "not learned (not measured)"
    (tmp_path / "stopped").mkdir()
    assert judge(tmp_path / "stopped") == RunGate(None, False, "did not finish")
    # a metric reader of its own (run_sweep(read_metric=...)) is judged by its value
    assert gate_reader(SelectSpec(metric="competence", task="tasks"), 0.9, {tmp_path: 0.95}.get)(tmp_path).learned


def test_read_gates_judges_the_picks_then_the_finished_runs_of_the_gating_stage(tmp_path: Path) -> None:
    spec = load_sweep_spec(write(tmp_path, GATED))
    pick = picked(tmp_path, spec)
    plans = plan_sweep(spec, [], {"grid": pick})
    seeds = plans[1]
    accuracy = {j.dir(tmp_path): a for j, a in zip(seeds.jobs, SEED_ACCURACY, strict=True)}
    accuracy |= {tmp_path / point.run: point.value for point in pick.points}
    assert set(read_gates(plan_sweep(spec, []), {}, tmp_path, 0.9, accuracy.get)) == set()  # nothing picked yet
    for job in seeds.jobs[:4]:  # alibi's seeds 1 and 2 have not run
        finish(job.dir(tmp_path))
    gates = read_gates(plans, {"grid": pick}, tmp_path, 0.9, accuracy.get)
    assert set(gates) == {j.key for j in seeds.jobs[:4]}
    assert plan_sweep(spec, [], {"grid": pick}, gates=gates)[2].awaiting_runs == "seeds"


# ----------------------------------------------------------------------------------------------------------------
# The runner


@pytest.mark.integration  # a sweep run (every job's config composed)
def test_the_sweep_runs_the_longer_runs_of_the_seeds_that_did_not_learn_and_says_which_it_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = load_sweep_spec(write(tmp_path, GATED))
    sweep_dir = (tmp_path / "out").resolve()
    pick = picked(sweep_dir, spec)
    seeds = plan_sweep(spec, [], {"grid": pick})[1]
    accuracy = {j.dir(sweep_dir): a for j, a in zip(seeds.jobs, SEED_ACCURACY, strict=True)}
    accuracy |= {sweep_dir / point.run: point.value for point in pick.points}
    ran: dict[str, list[str]] = {}

    def fake_stage(plan: StagePlan, sweep_dir: Path, *args: object) -> None:  # finishes what would run
        ran[plan.stage.name] = [j.key for j in plan.jobs]
        for job in plan.jobs:
            if job_status(job.dir(sweep_dir)) != "done":
                finish(job.dir(sweep_dir))

    monkeypatch.setattr(sweep_runner, "_run_stage", fake_stage)
    events: list[str] = []
    sweep_runner.run_sweep(
        spec, [], sweep_dir, on_event=lambda k, t: events.append(f"{k} {t}"), read_metric=accuracy.get
    )
    assert ran["long"] == ["long/train.lr=0.003/pos=rope,train.seed=1", "long/train.lr=0.001/pos=alibi,train.seed=1"]
    assert "skip stage long: pos=alibi train.seed=2 learned (92% >= the gate, 90%): no jobs" in events


def test_a_gated_stage_launches_exactly_the_jobs_it_kept(tmp_path: Path) -> None:
    """Hydra runs the product of a multirun's swept values: seed 1 of rope beside seeds 1 and 2 of alibi is not one
    product, so each scheme gets its own multirun (and a lone job its own)."""
    spec = load_sweep_spec(write(tmp_path, GATED))
    long = plan_sweep(spec, [])[2]
    for job in long.jobs:
        job.picked = ["train.lr=0.001"]
    kept = [
        j for j in long.jobs if j.name in ("pos=rope,train.seed=1", "pos=alibi,train.seed=1", "pos=alibi,train.seed=2")
    ]
    gated = StagePlan(
        stage=long.stage, fixed=long.fixed, swept=long.swept, jobs=kept, picked_keys=["train.lr"], group_by=("pos",)
    )
    launches = sweep_runner._launches(gated)
    for launch in launches:
        product = {
            ",".join(f"{k}={v}" for k, v in zip(launch.swept, values, strict=True))
            for values in itertools.product(*launch.swept.values())
        }
        assert product == {j.name for j in launch.jobs}
    assert [[j.name for j in la.jobs] for la in launches] == [
        ["pos=rope,train.seed=1"],
        ["pos=alibi,train.seed=1", "pos=alibi,train.seed=2"],
    ]
    # all kept (a product): one multirun, so its launcher runs the jobs in parallel
    whole = StagePlan(
        stage=long.stage,
        fixed=long.fixed,
        swept=long.swept,
        jobs=long.jobs,
        picked_keys=["train.lr"],
        group_by=("pos",),
    )
    assert len(sweep_runner._launches(whole)) == 1


def _dry_run(plans: list[StagePlan], out: Path) -> str:
    from posenc_cli.cli.app import console
    from posenc_cli.cli.sweep import _print_plan

    with console.capture() as captured:
        _print_plan("mine", plans, out, "basic", {})
    return " ".join(captured.get().split())


def test_the_dry_run_says_a_gate_by_stage_awaits_its_runs_then_which_it_left_out(tmp_path: Path) -> None:
    spec = load_sweep_spec(write(tmp_path, GATED))
    before = _dry_run(plan_sweep(spec, []), tmp_path).split("stage long", 1)[1]
    assert "not learned only: the jobs whose own run of stage seeds failed the gate" in before
    pick = picked(tmp_path, spec)
    waiting = _dry_run(plan_sweep(spec, [], {"grid": pick}), tmp_path).split("stage long", 1)[1]
    assert "awaits: the runs of stage seeds (each job runs by its own)" in waiting
    seeds = plan_sweep(spec, [], {"grid": pick})[1]
    done = plan_sweep(spec, [], {"grid": pick}, gates=verdicts(seeds, SEED_ACCURACY))
    after = _dry_run(done, tmp_path).split("stage long", 1)[1]
    assert "(train, after grid): 2 job(s)" in after and "awaits" not in after
    assert "left out: pos=rope train.seed=0 learned (100% >= the gate, 90%)" in after
    every = plan_sweep(spec, [], {"grid": pick}, gates=verdicts(seeds, [1.0] * 6))
    assert "(none) every run passed the competence gate" in _dry_run(every, tmp_path)


@pytest.mark.integration  # every job's config composed
def test_the_apis_dry_run_reads_the_picks_and_the_gating_runs_from_the_sweep_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from posenc_cli import api

    spec = load_sweep_spec(write(tmp_path, GATED))
    out = (tmp_path / "out").resolve()
    grid = plan_sweep(spec, [])[0]
    scores = {j.dir(out): a for j, a in zip(grid.jobs, GRID_ACCURACY, strict=True)}
    for job in grid.jobs:
        finish(job.dir(out))
    seeds = plan_sweep(spec, [], {"grid": picked(out, spec)})[1]
    scores |= {j.dir(out): a for j, a in zip(seeds.jobs, SEED_ACCURACY, strict=True)}

    def assess(run_dir: Path, task: str, gate: float = 0.9, scoring: str = "contains") -> Competence:
        value = scores[Path(run_dir)]
        return Competence(task, LEARNED if value >= gate else NOT_LEARNED, value, gate)

    monkeypatch.setattr(competence_mod, "assess_run", assess)
    plan = api.plan_sweep("mine", config_dir=tmp_path, out=out, check=True)
    assert plan.plans[2].awaiting_runs == "seeds"  # the seeds have not run
    for job in seeds.jobs:
        finish(job.dir(out))
    plan = api.plan_sweep("mine", config_dir=tmp_path, out=out, check=True)
    assert [j.name for j in plan.plans[2].jobs] == ["pos=rope,train.seed=1", "pos=alibi,train.seed=1"]


def test_an_extend_stage_from_a_gate_by_stage_awaits_its_runs_then_derives_from_the_runs_kept(tmp_path: Path) -> None:
    text = (
        GATED + "  - name: yarn\n    action: extend\n    parent: long/pos=rope\n    overrides: [extend.method=yarn]\n"
    )
    spec = load_sweep_spec(write(tmp_path, text))
    pick = picked(tmp_path, spec)
    plans = plan_sweep(spec, [], {"grid": pick})
    yarn = plans[3]
    assert yarn.jobs == [] and yarn.awaiting is None and yarn.awaiting_runs == "seeds" and yarn.waits
    shown = _dry_run(plans, tmp_path).split("stage yarn", 1)[1]
    assert "awaits: the runs of stage seeds (which decide its parent runs)" in shown
    assert "its parent runs await the runs of stage seeds" in shown
    yarn = plan_sweep(spec, [], {"grid": pick}, gates=verdicts(plans[1], SEED_ACCURACY))[3]
    assert [j.parent for j in yarn.jobs] == ["long/train.lr=0.003/pos=rope,train.seed=1"] and not yarn.waits
