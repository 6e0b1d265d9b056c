"""The competence gate's arithmetic (`evaluation.competence`): in-distribution accuracy over the training lengths,
the verdicts (learned, not learned, not trained on this task, cannot measure, not measured), and reading a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.data.algorithmic.base import GENERATOR_VERSION
from posenc_cli.data.sources.algorithmic import AlgorithmicDataConfig
from posenc_cli.data.sources.passkey import PasskeyDataConfig
from posenc_cli.data.sources.tasks import TasksDataConfig
from posenc_cli.errors import ConfigError
from posenc_cli.evaluation.competence import (
    PromptBound,
    algorithmic_competence,
    assess_run,
    check_threshold,
    competence,
    retrieval_competence,
    retrieval_mean_competence,
    run_longest_prompt,
    run_prompt_bound,
    task_family,
    trained_on,
)
from posenc_cli.evaluation.results import checkpoint_identity
from posenc_cli.run.meta import read_run_meta

runner = CliRunner()


def alg(task: str, n: int, accuracy: float | None, limit: int = 4) -> dict:
    status = "ok" if accuracy is not None else "n/a"
    return {"task": task, "length": n, "train_max_length": limit, "status": status, "accuracy": accuracy}


def test_algorithmic_mean_is_over_the_training_lengths_only() -> None:
    data = AlgorithmicDataConfig(tasks=["copy"], min_length=2, max_length=4)
    entries = [alg("copy", 1, 0.0), alg("copy", 2, 1.0), alg("copy", 3, 1.0), alg("copy", 4, 0.7)]
    entries += [alg("copy", n, 0.0) for n in range(5, 9)]  # beyond L: never part of it
    c = algorithmic_competence(entries, "copy", data, threshold=0.9)
    assert c.accuracy == pytest.approx(0.9) and c.lengths == (2, 4)  # length 1 is below data.min_length
    recorded = [{**e, "train_min_length": 3} for e in entries]  # a cell's own record wins
    assert algorithmic_competence(recorded, "copy", data).accuracy == pytest.approx(0.85)
    assert c.status == "learned" and c.learned  # >= the threshold passes
    assert algorithmic_competence(entries, "copy", data, threshold=0.95).status == "not learned"


def test_tasks_scored_at_many_positions_are_gated_on_their_per_token_accuracy() -> None:
    """MQAR's reference (Zoology) reports the share of queries right and flip-flop's the share of reads: a model right
    on 95% of them is competent although most whole sequences hold one error; S5 stays on exact match."""
    data = AlgorithmicDataConfig(tasks=["mqar", "flipflop", "s5"], max_length=4)
    for task in ("mqar", "flipflop"):
        entries = [{**alg(task, n, 0.5), "train_min_length": 4, "token_accuracy": 0.95} for n in (3, 4, 5)]
        c = algorithmic_competence(entries, task, data)
        assert c.accuracy == pytest.approx(0.95) and c.learned and c.lengths == (4, 4)
    entries = [{**alg("s5", n, 0.5), "token_accuracy": 0.95} for n in (2, 3, 4)]
    assert algorithmic_competence(entries, "s5", data).accuracy == pytest.approx(0.5)


def test_a_run_never_trained_on_the_task_says_so_first() -> None:
    data = AlgorithmicDataConfig(tasks=["copy"], max_length=4)
    entries = [alg("reverse", n, 1.0) for n in range(1, 5)]
    c = algorithmic_competence(entries, "reverse", data)
    assert c.status == "not trained on this task" and c.accuracy == 1.0  # the number stays, the label wins
    assert "not trained on this task" in c.text and "100%" in c.text
    assert not trained_on(TasksDataConfig(tasks=["niah-single"]), "niah-multikey")
    assert trained_on(TasksDataConfig(tasks=["niah-single"]), "niah-single")
    assert trained_on(PasskeyDataConfig(), "passkey") and not trained_on(PasskeyDataConfig(), "copy")
    assert trained_on(None, "copy")  # a config that cannot be read: the accuracy decides


def test_unmeasurable_and_unmeasured_are_told_apart() -> None:
    data = AlgorithmicDataConfig(tasks=["copy"], max_length=2)
    cannot = algorithmic_competence([alg("copy", 1, None, 2), alg("copy", 2, None, 2)], "copy", data)
    assert cannot.status == "cannot measure" and cannot.accuracy is None
    assert algorithmic_competence([], "copy", data).status == "not measured"
    texts = {cannot.text, algorithmic_competence([], "copy", data).text}
    assert len(texts) == 2


def test_all_algorithmic_tasks_learned_only_when_each_is() -> None:
    data = AlgorithmicDataConfig(tasks=["copy", "reverse"], max_length=2)
    entries = [alg("copy", n, 1.0, 2) for n in (1, 2)] + [alg("reverse", n, 0.84, 2) for n in (1, 2)]
    c = algorithmic_competence(entries, "algorithmic", data, threshold=0.9)
    assert c.accuracy == pytest.approx(0.92) and c.status == "not learned"


def cell(length: int, multiple: float, score: float | None, depth: float = 0.0) -> dict:
    status = "ok" if score is not None else "n/a"
    return {"task": "niah-single", "length": length, "multiple": multiple, "depth": depth, "status": status,
            "score": score}  # fmt: skip


def test_retrieval_counts_the_lengths_up_to_the_training_length() -> None:
    data = TasksDataConfig(tasks=["niah-single"])
    entries = [cell(64, 0.5, 1.0), cell(128, 1.0, 0.8, 0.0), cell(128, 1.0, 1.0, 1.0), cell(256, 2.0, 0.0)]
    c = retrieval_competence(entries, "niah-single", data, 128, threshold=0.9)
    assert c.accuracy == pytest.approx((1.0 + 0.8 + 1.0) / 3) and c.status == "learned" and c.lengths == (64, 128)
    by_multiple = retrieval_competence(entries, "niah-single", data, None, threshold=0.95)
    assert by_multiple.accuracy == c.accuracy and by_multiple.status == "not learned"


def test_the_threshold_is_an_accuracy() -> None:
    check_threshold(0.0)
    with pytest.raises(ConfigError, match="--competence must be an accuracy in"):
        check_threshold(1.5)


def test_a_run_directory_is_read_at_its_current_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    tiny = ["model=tiny", "model.d_model=16", "model.n_layer=1", "model.n_head=2", "train.seq_len=32"]
    data = ["data=algorithmic", "data.tasks=[copy]", "data.examples=200", "data.max_length=2"]
    trained = runner.invoke(
        app, ["train", *tiny, *data, "train.steps=1", "train.batch_size=2", "train.threads=1", "--out", str(run)]
    )
    assert trained.exit_code == 0, trained.output
    assert competence(run, "copy") is None and assess_run(run, "copy").status == "not measured"
    checkpoint = checkpoint_identity(read_run_meta(run))
    entries = [
        {**alg("copy", n, a, 2), "generator": GENERATOR_VERSION, "checkpoint": checkpoint}
        for n, a in [(1, 1.0), (2, 0.5)]
    ]
    entries.append({**alg("copy", 2, 1.0, 2), "generator": GENERATOR_VERSION, "checkpoint": {**checkpoint, "step": -1}})
    (run / "eval").mkdir(exist_ok=True)
    doc = {"schema_version": 1, "run": "run", "scheme": "rope", "entries": entries}
    (run / "eval" / "algorithmic.json").write_text(json.dumps(doc))
    assert competence(run, "copy") == pytest.approx(0.75)  # the other checkpoint's cell is not counted
    assert assess_run(run, "copy", threshold=0.7).learned
    assert assess_run(run, "reverse").status == "not trained on this task"
    assert assess_run(run, "passkey").status == "not trained on this task"
    with pytest.raises(ConfigError, match="unknown task"):
        assess_run(run, "copi")


def test_addition_weighs_lengths_as_its_split_does() -> None:
    # addition's split holds 2(n - least) + 1 operand-length bins of length n: length 5 weighs 3, length 4 weighs 1
    entries = [
        {**alg("addition", 4, 1.0, 5), "train_min_length": 4},
        {**alg("addition", 5, 0.0, 5), "train_min_length": 4},
    ]
    c = algorithmic_competence(entries, "addition", AlgorithmicDataConfig(tasks=["addition"], max_length=5))
    assert c.accuracy == pytest.approx(0.25) and c.lengths == (4, 5)


def test_the_retrieval_tasks_together_are_learned_only_when_each_is() -> None:
    data = TasksDataConfig(tasks=["niah-single", "variable-tracking"])
    single = [cell(128, 1.0, 1.0), cell(128, 1.0, 1.0, 1.0), cell(256, 2.0, 0.0)]
    tracking = [{**cell(128, 1.0, 0.8), "task": "variable-tracking"}]
    c = retrieval_mean_competence(single + tracking, data, 128, threshold=0.85)
    assert c.task == "tasks" and c.accuracy == pytest.approx(0.9)  # each task weighs the same, not each cell
    assert c.status == "not learned"  # the mean passes, variable tracking does not
    assert retrieval_mean_competence(single + tracking, data, 128, threshold=0.8).learned
    unmeasured = retrieval_mean_competence(single, data, 128)  # variable tracking has no cell: no mean
    assert unmeasured.accuracy is None and unmeasured.status == "not measured"
    assert task_family("tasks") == "retrieval" and trained_on(data, "tasks")
    assert not trained_on(AlgorithmicDataConfig(tasks=["copy"]), "tasks")


def test_a_1x_prompt_longer_than_every_training_example_is_not_in_distribution() -> None:
    """A run trained one example per row saw nothing longer than its longest example: 1× cells whose prompt (length
    less the generation budget) is longer measure length generalisation, so the gate says so instead of a verdict."""
    data = TasksDataConfig(tasks=["niah-single"])
    generated = [{**cell(128, 1.0, s, d), "generate": 32} for s, d in ((0.0, 0.0), (1.0, 0.5), (1.0, 1.0))]
    beyond = retrieval_competence(generated, "niah-single", data, 128, longest_prompt=81)  # prompts of 96 tokens
    assert beyond.status == "longer than its training examples" and not beyond.learned
    assert beyond.accuracy == pytest.approx(2 / 3)  # shown, flagged
    assert beyond.text == "67% ⇥ longer than its training examples"
    seen = retrieval_competence(generated, "niah-single", data, 128, longest_prompt=96)  # 96 <= 96: in distribution
    assert seen.status == "not learned" and seen.accuracy == pytest.approx(2 / 3)
    assert retrieval_competence(generated, "niah-single", data, 128).status == "not learned"  # nothing recorded
    # the shorter cells that fit still count, the longer ones are left out
    short = [{**cell(64, 0.5, 1.0), "generate": 32}, *generated]
    fits = retrieval_competence(short, "niah-single", data, 128, longest_prompt=81)
    assert fits.accuracy == 1.0 and fits.learned and fits.lengths == (64, 64)
    # together: one task beyond its examples flags the mean; a task never trained on still says so first
    both = TasksDataConfig(tasks=["niah-single", "variable-tracking"])
    tracking = [{**cell(128, 1.0, 1.0), "task": "variable-tracking", "generate": 16}]  # prompt 112
    mean = retrieval_mean_competence(generated + tracking, both, 128, longest_prompt=120)
    assert mean.status == "not learned"
    mean = retrieval_mean_competence(generated + tracking, both, 128, longest_prompt=100)
    assert mean.status == "longer than its training examples"
    never = retrieval_competence(generated, "niah-single", TasksDataConfig(tasks=["vt"]), 128, longest_prompt=81)
    assert never.status == "not trained on this task"


def test_a_mixture_bounds_each_task_by_its_own_longest_prompt() -> None:
    """In a mixture the longest prompt of one task says nothing of another's: a task whose own training prompts
    stop short of its 1× prompt is beyond them though the mixture's longest prompt is not."""
    both = TasksDataConfig(tasks=["niah-single", "variable-tracking"])
    generated = [{**cell(128, 1.0, 1.0, d), "generate": 32} for d in (0.0, 0.5, 1.0)]  # prompts of 96 tokens
    tracking = [{**cell(128, 1.0, 1.0), "task": "variable-tracking", "generate": 16}]  # prompt 112
    mixture = PromptBound(120, {"niah-single": 81, "variable-tracking": 120})
    assert retrieval_competence(generated, "niah-single", both, 128, longest_prompt=120).learned
    single = retrieval_competence(generated, "niah-single", both, 128, longest_prompt=mixture)
    assert single.status == "longer than its training examples" and single.accuracy == 1.0
    assert retrieval_competence(tracking, "variable-tracking", both, 128, longest_prompt=mixture).learned
    mean = retrieval_mean_competence(generated + tracking, both, 128, longest_prompt=mixture)
    assert mean.status == "longer than its training examples"
    assert PromptBound(120, {"niah-single": 81}).of("variable-tracking") == 120  # a task not told: the run's bound


def test_a_mixture_run_records_each_task_s_longest_prompt(tmp_path: Path) -> None:
    run = tmp_path / "run"
    tiny = ["model=tiny", "model.d_model=16", "model.n_layer=1", "model.n_head=2", "train.seq_len=256"]
    data = ["data=tasks", "data.tasks=[niah-single,variable-tracking]", "data.episodes=60", "data.max_len=160"]
    args = ["train", *tiny, *data, "train.steps=1", "train.batch_size=2", "train.threads=1", "train.packing=none"]
    result = runner.invoke(app, [*args, "--out", str(run)])
    assert result.exit_code == 0, result.output
    data = read_run_meta(run).record["data"]
    by_task = data["longest_prompt_by_task"]
    assert set(by_task) == {"niah-single", "variable-tracking"} and max(by_task.values()) == data["longest_prompt"]
    bound = run_prompt_bound(run)
    assert bound is not None and bound.by_task == by_task and bound.longest == data["longest_prompt"]
    assert bound.of("niah-single") == by_task["niah-single"]


def test_a_run_records_the_longest_prompt_the_gate_reads(tmp_path: Path) -> None:
    run = tmp_path / "run"
    tiny = ["model=tiny", "model.d_model=16", "model.n_layer=1", "model.n_head=2", "train.seq_len=32"]
    data = ["data=algorithmic", "data.tasks=[copy]", "data.examples=200", "data.max_length=2"]
    args = ["train", *tiny, *data, "train.steps=1", "train.batch_size=2", "train.threads=1"]
    assert runner.invoke(app, [*args, "train.packing=none", "--out", str(run)]).exit_code == 0
    data = read_run_meta(run).record["data"]
    assert run_longest_prompt(run) == data["longest_prompt"] < data["longest_example"]
    meta = json.loads((run / "meta.json").read_text())  # a run recorded with the example's length only
    del meta["data"]["longest_prompt"]
    (run / "meta.json").write_text(json.dumps(meta))
    assert run_longest_prompt(run) == data["longest_example"]
    stream = tmp_path / "stream"
    assert runner.invoke(app, [*args, "--out", str(stream)]).exit_code == 0
    assert run_longest_prompt(stream) is None  # windows of the stream: every length up to the row
    assert run_longest_prompt(tmp_path / "missing") is None
