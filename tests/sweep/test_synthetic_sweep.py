"""configs/sweep/synthetic.yaml (issue #44 item 3): it parses and plans into the grid it promises, every job trains
one task with the reference's recipe (loss on the scored tokens, one example per row) at seed 0, its select stages
pick the learning rate by competence on their own task, and each stage's rows hold its task's longest example."""

from __future__ import annotations

import numpy as np
import pytest

from posenc_cli.config import config_dir
from posenc_cli.data.algorithmic import task_class
from posenc_cli.sweep.plan import plan_sweep, validate_plan
from posenc_cli.sweep.select import line_value
from posenc_cli.sweep.spec import find_sweep_file, load_sweep_spec

SCHEMES = {"path", "fox", "rope", "alibi", "nope"}
TASKS = ("mqar", "flipflop", "s5")


@pytest.fixture(scope="module")
def plans() -> list:
    path = find_sweep_file("synthetic", [config_dir()])
    assert path.read_text().startswith("# posenc sweep synthetic")
    return plan_sweep(load_sweep_spec(path), [])


def lines(plan) -> list[list[str]]:
    return [job.overrides for job in plan.jobs]


def selects(plans: list) -> list:
    return [p for p in plans if p.stage.action == "select"]


@pytest.mark.integration  # composes a shipped sweep's jobs
def test_it_validates_and_plans_six_schemes_by_two_rates_per_task(plans: list) -> None:
    validate_plan(selects(plans), None)
    names = [s for t in TASKS for s in (t, f"{t}-layout")]
    seeds = [f"{n}-seeds" for n in names]
    assert [p.stage.name for p in plans] == [*names, *seeds, "mqar-long", "mqar-layout-long"]
    for plan in selects(plans):
        assert plan.stage.action == "select"
        rates = {line_value(o, "train.lr") for o in lines(plan)}
        assert rates == {"0.001", "0.003"}
        schemes = {line_value(o, "pos") for o in lines(plan)}
        assert schemes == ({"layout"} if plan.stage.name.endswith("-layout") else SCHEMES)
    assert sum(len(p.jobs) for p in selects(plans)) == 3 * 6 * 2


def test_seeds_follow_each_select_stage_for_the_rows_that_learned_with_its_task(plans: list) -> None:
    """The seeds stages (issue #44: 3 seeds only for the rows that pass the gate) run after their select stage's
    pick, leave out the schemes below the gate, and train the select stage's task at the same row length."""
    by_name = {p.stage.name: p for p in plans}
    for plan in [p for p in plans if p.stage.name.endswith("-seeds")]:
        select = by_name[plan.stage.name.removesuffix("-seeds")]
        assert plan.stage.after == select.stage.name and plan.stage.runs_for == "learned"
        assert plan.awaiting == select.stage.name and len(plan.jobs) == 3 * len(select.jobs) // 2
        assert {line_value(o, "train.seed") for o in lines(plan)} == {"0", "1", "2"}
        assert plan.stage.overrides == select.stage.overrides and plan.stage.label == select.stage.label


def test_every_job_trains_one_task_on_its_scored_tokens_at_seed_0(plans: list) -> None:
    for plan in selects(plans):
        task = plan.stage.name.removesuffix("-layout")
        rule = plan.stage.select
        assert (rule.metric, rule.task, rule.group_by) == ("competence", task, ("pos",))
        for o in lines(plan):
            assert line_value(o, "data.tasks") == f"[{task}]"
            assert line_value(o, "train.loss_on") == "answer" and line_value(o, "train.packing") == "none"
            assert line_value(o, "train.seed") == "0"


def test_each_stage_row_holds_its_tasks_longest_training_example(plans: list) -> None:
    """train.packing=none refuses an example longer than train.seq_len + 1 tokens (its end-of-document tokens
    included); the byte tokenizer makes a character one token. MQAR's longest is the one whose last query sits in
    the last slot."""
    rng = np.random.default_rng(0)
    for plan in selects(plans):
        task = plan.stage.name.removesuffix("-layout")
        o = lines(plan)[0]
        seq_len, longest = int(line_value(o, "train.seq_len")), int(line_value(o, "data.max_length"))
        examples = [task_class(task).sample(rng, longest) for _ in range(400)]
        tokens = max(len(e.text.encode()) for e in examples) + 2
        assert tokens <= seq_len + 1, (task, tokens, seq_len)
        assert tokens >= seq_len - 8, (task, tokens, seq_len)  # rows no longer than the task needs


def test_mqar_gets_a_learning_curve_four_times_as_long_for_every_pick(plans: list) -> None:
    """No scheme reached the gate on MQAR in 1,500 steps: each pick (not only the learned ones) trains 6,000."""
    by_name = {p.stage.name: p for p in plans}
    for name in ("mqar", "mqar-layout"):
        long, select = by_name[f"{name}-long"], by_name[name]
        assert long.stage.after == name and long.stage.runs_for is None
        assert len(long.jobs) == len(select.jobs) // 2 and long.stage.overrides == select.stage.overrides
        assert {line_value(o, "train.steps") for o in lines(long)} == {"6000"}
