"""The learn-then-measure designs of DroPE's Table 1 (`data-dependent-niah`) and of the hybrids' niah-single
(`hybrids-niah`), issue #38 item 4: the stages and job counts they plan, the recipe every job trains with, DroPE's
switch at 7/8 of each stage's steps, and seed 0 of each pick being the grid's run (copied, not trained again)."""

from __future__ import annotations

import pytest

from posenc_cli.config import config_dir
from posenc_cli.sweep.gating import RunGate
from posenc_cli.sweep.identity import identity_hash
from posenc_cli.sweep.plan import StagePlan, plan_identities, plan_sweep, validate_plan
from posenc_cli.sweep.select import GridJob, GridPoint, Pick, group_of, line_value
from posenc_cli.sweep.spec import find_sweep_file, load_sweep_spec

pytestmark = pytest.mark.integration  # composes every job of two shipped sweeps: not in the fast lane

DESIGNS = {  # name: (stage, action, jobs planned, the select stage it awaits) in the file's order
    "data-dependent-niah": [
        ("grid", "select", 14, None),
        ("grid-drope", "select", 2, None),
        ("seeds", "train", 21, "grid"),
        ("seeds-drope", "train", 3, "grid-drope"),
        ("long", "train", 7, "grid"),
        ("long-drope", "train", 1, "grid-drope"),
    ],
    "hybrids-niah": [("grid", "select", 14, None), ("seeds", "train", 21, "grid"), ("long", "train", 21, "grid")],
}
TEXT_ONLY = [("text", "train", 7, None), ("text-drope", "train", 1, None)]  # data-dependent: the niah stages moved out


def plans_of(
    name: str, picks: dict[str, Pick] | None = None, gates: dict[str, RunGate] | None = None
) -> list[StagePlan]:
    path = find_sweep_file(name, [config_dir()])
    assert path.read_text().startswith(f"# posenc sweep {name} ")
    return plan_sweep(load_sweep_spec(path), [], picks, gates=gates)


def seed_gates(plans: list[StagePlan], competence: float, below: tuple[str, ...] = ()) -> dict[str, RunGate]:
    """The verdict on every run of stage `seeds` (what its finished runs would give): `competence` for all, 0.5 for
    the job names in `below`."""
    seeds = next(p for p in plans if p.stage.name == "seeds")
    return {j.key: RunGate.of_value(0.5 if j.name in below else competence, 0.9) for j in seeds.jobs}


def pick_all(plan: StagePlan, lr: str, competence: float = 1.0) -> Pick:
    """A pick of `lr` for every group of the select stage `plan`, each scoring `competence` (what a finished grid
    would give)."""
    rule = plan.stage.select
    assert rule is not None
    groups = {group_of(job.overrides, rule.group_by) for job in plan.jobs}
    chosen = {
        g: GridPoint(run="r", group=g, setting=(f"train.lr={lr}",), status="done", value=competence) for g in groups
    }
    return Pick(stage=plan.stage.name, rule=rule, chosen=("train.lr",), points=(), chosen_points=chosen)


def lr(job: GridJob) -> float:
    return float(line_value(job.overrides, "train.lr") or "nan")


@pytest.mark.parametrize("name", sorted(DESIGNS))
def test_the_design_plans_its_stages_under_the_learn_then_measure_recipe(name: str) -> None:
    plans = plans_of(name)
    got = [(p.stage.name, p.stage.action, len(p.jobs), p.awaiting) for p in plans]
    assert got == DESIGNS[name]
    configs = validate_plan(plans, None)  # the grids resolve; the later stages are checked without their pick
    assert len(configs) == 14 + (2 if name == "data-dependent-niah" else 0)
    for cfg in configs.values():
        assert (cfg.train.loss_on, cfg.train.packing) == ("answer", "none")
        assert cfg.train.lr in (3e-4, 1e-3) and cfg.train.seed == 0
    grid = plans[0]
    assert grid.chosen == ["train.lr"] and grid.stage.select is not None
    assert grid.stage.select.metric == "competence"


def test_drope_drops_at_seven_eighths_of_each_stage_and_no_other_scheme_drops() -> None:
    plans = plans_of("data-dependent-niah")
    picks = {p.stage.name: pick_all(p, "1e-3", competence=0.5) for p in plans if p.stage.action == "select"}
    configs = validate_plan(plans_of("data-dependent-niah", picks), None)
    assert len(configs) == 14 + 2 + 21 + 3 + 7 + 1
    for key, cfg in configs.items():
        stage = key.split("/", 1)[0]
        if stage.endswith("-drope"):
            assert cfg.pos.name == "rope" and cfg.train.drope_at * 8 == cfg.train.steps * 7, key
        else:
            assert cfg.train.drope_at == 0, key
        assert cfg.train.steps == (8000 if stage.startswith("long") else 4000), key
        assert list(cfg.data.tasks) == ["niah-multikey", "niah-multivalue", "niah-multiquery"]


def test_twice_the_steps_only_for_the_picks_below_the_gate() -> None:
    """data-dependent-niah's stage `long` is the learning curve's last point of a scheme whose pick has not learned
    at the chosen steps (`not_learned_only`): a pick that passed the gate trains no longer run; seeds are trained
    either way."""
    plans = plans_of("data-dependent-niah")
    for competence, long_jobs in ((0.95, 0), (0.5, 7)):
        picks = {p.stage.name: pick_all(p, "1e-3", competence) for p in plans if p.stage.action == "select"}
        by_stage = {p.stage.name: p for p in plans_of("data-dependent-niah", picks)}
        assert len(by_stage["long"].jobs) == long_jobs
        assert len(by_stage["long"].left_out) == 7 - long_jobs
        assert len(by_stage["seeds"].jobs) == 21


def test_twice_the_steps_for_each_seed_below_the_gate() -> None:
    """hybrids-niah's stage `long` follows each run of `seeds` (`gate_by`): iRoPE's seeds 1 and 2 stayed below the
    gate where its seed 0, the pick, learned, and they get the longer runs."""
    plans = plans_of("hybrids-niah")
    picks = {"grid": pick_all(plans[0], "1e-3", 0.95)}
    assert plans_of("hybrids-niah", picks)[2].awaiting_runs == "seeds"  # until the seeds ran
    for competence, below, long_jobs in ((0.95, (), 0), (0.5, (), 21), (0.95, ("pos=irope,train.seed=1",), 1)):
        gates = seed_gates(plans_of("hybrids-niah", picks), competence, below)
        long = plans_of("hybrids-niah", picks, gates)[2]
        assert len(long.jobs) == long_jobs and len(long.left_out) == 21 - long_jobs
    irope = ("pos=irope,train.seed=1", "pos=irope,train.seed=2")
    long = plans_of("hybrids-niah", picks, seed_gates(plans_of("hybrids-niah", picks), 0.95, irope))[2]
    assert [j.key for j in long.jobs] == [f"long/train.lr=1e-3/{name}" for name in irope]
    (steps,) = {c.train.steps for c in validate_plan([long], None).values()}
    assert steps == 4000


@pytest.mark.parametrize(("name", "grid_count"), [("data-dependent-niah", 2), ("hybrids-niah", 1)])
def test_seed_zero_of_each_pick_is_the_grid_run(name: str, grid_count: int) -> None:
    """The sweep copies a later job whose identity is a done grid job's (`sweep.reuse`): seed 0 of every pick, so
    `seeds` trains two new runs per scheme, not three."""
    plans = plans_of(name)
    picks = {p.stage.name: pick_all(p, "3e-4") for p in plans if p.stage.action == "select"}
    resolved = plans_of(name, picks)
    resolved = plans_of(name, picks, seed_gates(resolved, 0.5))  # hybrids-niah's long: every seed below the gate
    identities = plan_identities(resolved, validate_plan(resolved, None))
    grids = {p.stage.name: p for p in resolved if p.stage.action == "select"}
    grid_ids = {identity_hash(identities[j.key]): j.key for p in grids.values() for j in p.jobs}
    assert len(grids) == grid_count
    for plan in (p for p in resolved if p.stage.name.startswith("seeds")):
        assert plan.stage.after is not None
        select = grids[plan.stage.after]
        for job in plan.jobs:
            source = grid_ids.get(identity_hash(identities[job.key]))
            if "train.seed=0" not in job.name:
                assert source is None, job.key  # seeds 1 and 2 are trained
                continue
            group = group_of(job.overrides, ("pos",))
            (expected,) = [g.key for g in select.jobs if group_of(g.overrides, ("pos",)) == group and lr(g) == 3e-4]
            assert source == expected, job.key
    long_ids = [identity_hash(identities[j.key]) for p in resolved if p.stage.name.startswith("long") for j in p.jobs]
    assert not set(long_ids) & set(grid_ids)  # twice the steps: new runs


def test_the_data_dependent_sweep_keeps_its_text_stages_only() -> None:
    """Its former niah stages (1,000 steps, every token of packed windows) are `data-dependent-niah` now."""
    plans = plans_of("data-dependent")
    assert [(p.stage.name, p.stage.action, len(p.jobs), p.awaiting) for p in plans] == TEXT_ONLY
    assert all("data=tasks" not in job.overrides for p in plans for job in p.jobs)
