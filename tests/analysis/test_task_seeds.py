"""Task tables over seeds (`analysis.task_seeds`, `compare --seed-mean`, `api.task_seed_scores`): hand-written run
directories (a saved config and eval/tasks.json, no weights) whose seeds' scores give hand-computed means and sds;
the pure aggregation of one experiment's seeds; the API's DataFrame."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest

from posenc_cli import api
from posenc_cli.analysis.task_seeds import SEED_COLUMNS, Seed, aggregate, comparable, mean_sd, row_state
from posenc_cli.config import Config, ModelConfig, config_to_yaml
from posenc_cli.data.ruler.base import GENERATOR_VERSION
from posenc_cli.data.sources.tasks import TasksDataConfig
from posenc_cli.positional import config_class
from posenc_cli.report.gate import LEARNED, NOT_LEARNED, NOT_MEASURED, NOT_TRAINED
from posenc_cli.run.journal import commit_checkpoint
from posenc_cli.sweep.markers import mark_done

N, L2, L4 = 16, 32, 64  # the runs' training length and its 2× and 4×
# (scheme, seed) -> task -> length -> score (None: n/a); every run trained on niah-single and (but alibi)
# niah-multikey, at train length 16, on answer tokens only (no perplexity: only task tables)
SCORES: dict[tuple[str, int], dict[str, dict[int, float | None]]] = {
    ("rope", 0): {"niah-single": {N: 1.0, L2: 0.6, L4: 0.2}, "niah-multikey": {N: 1.0, L2: 0.5}},
    ("rope", 1): {"niah-single": {N: 0.9, L2: 0.4, L4: 0.1}, "niah-multikey": {N: 0.95, L2: 0.3}},
    ("rope", 2): {"niah-single": {N: 0.95, L2: 0.5, L4: None}, "niah-multikey": {N: 0.5, L2: 0.1}},
    ("alibi", 0): {"niah-single": {N: 1.0, L2: 0.9}, "niah-multikey": {N: 0.2, L2: 0.1}},
    ("alibi", 1): {"niah-multikey": {N: 0.4, L2: 0.3}},  # no niah-single cell stored
    ("t5", 0): {"niah-single": {N: 0.9, L2: 0.7}},
}
TRAINED = {"rope": ["niah-single", "niah-multikey"], "alibi": ["niah-single"], "t5": ["niah-single"]}


def seed_run(
    run_dir: Path, scheme: str, seed: int, scores: dict[str, dict[int, float | None]], steps: int = 400
) -> None:
    """A run of `scheme` and `seed` trained on `TRAINED[scheme]` (answer tokens only) for `steps`, with one
    eval-tasks cell per task × length (depth 0.5, RULER's scoring) holding `scores`."""
    data = TasksDataConfig(tasks=TRAINED[scheme])
    cfg = Config(model=ModelConfig(), pos=config_class(scheme)(name=scheme), data=data)
    cfg.train.seed, cfg.train.loss_on, cfg.train.steps = seed, "answer", steps
    meta = {"kind": "posenc-run", "schema_version": 1, "step": 1, "train_length": N, "base_length": N,
            "status": "complete", "data": {"fingerprint": "x"}}  # fmt: skip
    commit_checkpoint(run_dir, {"config.yaml": config_to_yaml(cfg).encode()}, meta)
    entries = [
        {"task": task, "length": n, "multiple": n / N, "depth": 0.5, "trials": 10, "scoring": "contains",
         "generate": 4, "generator": GENERATOR_VERSION, "checkpoint": {"step": 1, "model_sha256": None},
         "status": "ok" if score is not None else "n/a", "score": score,
         "reason": None if score is not None else "the scheme cannot read it"}
        for task, by_length in scores.items() for n, score in by_length.items()
    ]  # fmt: skip
    doc = {"schema_version": 1, "run": run_dir.name, "scheme": scheme, "train_length": N, "base_length": N}
    (run_dir / "eval").mkdir(exist_ok=True)
    (run_dir / "eval" / "tasks.json").write_text(json.dumps({**doc, "entries": entries}))
    mark_done(run_dir, run_dir.name)  # a sweep job counts only with its done marker


def write_seed_runs(root: Path) -> Path:
    """`SCORES`' runs as root/s<seed>/<scheme>: runs of one scheme share a label and differ only in their seed."""
    for (scheme, seed), scores in SCORES.items():
        seed_run(root / f"s{seed}" / scheme, scheme, seed, scores)
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_seed_runs(tmp_path_factory.mktemp("seeds"))


def cell(frame: Any, label: str, task: str, length: int) -> Any:
    (row,) = frame[(frame.label == label) & (frame.task == task) & (frame.length == length)].itertuples()
    return row


def test_means_and_sds_are_the_hand_computed_ones(runs: Path) -> None:
    frame = api.task_seed_scores([runs])
    assert list(frame.columns) == SEED_COLUMNS
    first = cell(frame, "rope", "niah-single", N)
    assert (first.mean, first.sd, first.n, first.measured) == (pytest.approx(0.95), pytest.approx(0.05), 3, 3)
    assert first.multiple == 1.0 and first.in_distribution == pytest.approx(0.95)
    second = cell(frame, "rope", "niah-single", L2)
    assert (second.mean, second.sd) == (pytest.approx(0.5), pytest.approx(0.1))
    assert (first.competence, first.n_learned) == (LEARNED, 3)


def test_a_length_one_seed_could_not_score_is_no_mean(runs: Path) -> None:
    """Seed 2's 4× is n/a: the cell has no mean over the two other seeds, and says how many scored it."""
    fourth = cell(api.task_seed_scores([runs]), "rope", "niah-single", L4)
    assert math.isnan(fourth.mean) and math.isnan(fourth.sd) and (fourth.n, fourth.measured) == (3, 2)


def test_a_row_with_one_unlearned_seed_is_flagged(runs: Path) -> None:
    row = cell(api.task_seed_scores([runs]), "rope", "niah-multikey", N)
    assert (row.competence, row.n_learned, row.n) == (NOT_LEARNED, 2, 3)
    assert row.in_distribution == pytest.approx((1.0 + 0.95 + 0.5) / 3)
    assert row.mean == pytest.approx((1.0 + 0.95 + 0.5) / 3)  # learned or not, one measure: averaged
    assert api.task_seed_scores([runs], competence=0.5).pipe(cell, "rope", "niah-multikey", N).competence == LEARNED


def test_a_row_of_runs_not_trained_on_the_task_shows_that_state(runs: Path) -> None:
    row = cell(api.task_seed_scores([runs]), "alibi", "niah-multikey", N)
    assert (row.competence, row.n_learned, row.n) == (NOT_TRAINED, 0, 2)
    assert row.mean == pytest.approx(0.3)  # every seed in that state: their scores still average


def test_a_seed_without_cells_makes_the_row_not_measured_with_no_mean(runs: Path) -> None:
    frame = api.task_seed_scores([runs])
    for length in (N, L2):
        row = cell(frame, "alibi", "niah-single", length)
        assert (row.competence, row.n_learned, row.n, row.measured) == (NOT_MEASURED, 1, 2, 1)
        assert math.isnan(row.mean) and math.isnan(row.in_distribution)


def test_a_run_alone_is_a_row_of_one_without_spread(runs: Path) -> None:
    row = cell(api.task_seed_scores([runs]), "t5", "niah-single", L2)
    assert (row.n, row.mean, row.competence) == (1, pytest.approx(0.7), LEARNED) and math.isnan(row.sd)


def test_comparison_returns_the_frame_only_when_asked(runs: Path) -> None:
    assert api.comparison([runs]).task_seeds is None
    frame = api.comparison([runs], seed_mean=True).task_seeds
    assert frame is not None and set(frame.label) == {"rope", "alibi", "t5"}
    assert frame.attrs["competence"] == 0.9


def test_results_csv_keeps_a_row_per_run_and_the_csv_view_has_the_means(runs: Path, tmp_path: Path) -> None:
    report = api.comparison([runs], seed_mean=True, out=tmp_path / "out")
    written = (tmp_path / "out" / "results.csv").read_text()
    assert "rope · seed 2,," in written and "\nrope,," not in written  # per run
    shown = list(csv.DictReader(io.StringIO(report.comparison.to_csv())))
    (first,) = [r for r in shown if (r["label"], r["task"], r["length"]) == ("rope", "niah-single", str(N))]
    assert float(first["score"]) == pytest.approx(0.95) and float(first["sd"]) == pytest.approx(0.05)
    assert (first["n"], first["measured"], first["n_learned"], first["competence"]) == ("3", "3", "3", LEARNED)


def test_experiments_of_one_label_are_named_by_their_sweep_stage(tmp_path: Path) -> None:
    """A sweep's `seeds` stage (two seeds) and its `long` stage (twice the steps, one seed) label their runs alike:
    two experiments, named by stage."""
    jobs = []
    for stage, seed, steps, score in (("seeds", 0, 400, 1.0), ("seeds", 1, 400, 0.8), ("long", 0, 800, 0.9)):
        name = f"{stage}/rope-{seed}"
        seed_run(tmp_path / name, "rope", seed, {"niah-single": {N: score}}, steps=steps)
        jobs.append({"stage": stage, "name": name, "dir": name, "label": "rope", "parent": None, "swept": {}})
    (tmp_path / "sweep.json").write_text(json.dumps({"schema_version": 1, "sweep": "t", "jobs": jobs}))
    frame = api.task_seed_scores([tmp_path]).set_index("label")
    assert (frame.loc["rope · seeds", "n"], frame.loc["rope · seeds", "mean"]) == (2, pytest.approx(0.9))
    assert frame.loc["rope · seeds", "competence"] == NOT_LEARNED and frame.loc["rope · seeds", "n_learned"] == 1
    assert (frame.loc["rope · long", "n"], frame.loc["rope · long", "mean"]) == (1, pytest.approx(0.9))


@pytest.mark.parametrize("pattern", ["rope-s{}", "rope_seed{}", "pos=rope,train.seed={}"])
def test_seeds_named_by_their_directories_are_one_experiment(tmp_path: Path, pattern: str) -> None:
    """Runs outside a sweep named by their seed ('rope-s0', 'rope-s1') average as one row named without it; a run
    whose name holds another seed, or whose config differs by more than the seed, keeps its own name and row."""
    for seed, score in ((0, 1.0), (1, 0.8)):
        seed_run(tmp_path / pattern.format(seed), "rope", seed, {"niah-single": {N: score}})
    seed_run(tmp_path / pattern.format(7), "rope", 2, {"niah-single": {N: 0.5}})  # named 7, trained with seed 2
    seed_run(tmp_path / pattern.format(3), "rope", 3, {"niah-single": {N: 0.2}}, steps=800)  # another experiment
    frame = api.task_seed_scores([tmp_path]).set_index("label")
    base = pattern.format(0).removesuffix("-s0").removesuffix("_seed0").removesuffix(",train.seed=0")
    assert (frame.loc[base, "n"], frame.loc[base, "mean"]) == (2, pytest.approx(0.9))
    assert frame.loc[pattern.format(7), "n"] == 1 and frame.loc[pattern.format(3), "n"] == 1


def test_a_lone_run_named_by_its_seed_keeps_its_name(tmp_path: Path) -> None:
    seed_run(tmp_path / "rope-s1", "rope", 1, {"niah-single": {N: 1.0}})
    assert list(api.task_seed_scores([tmp_path]).label.unique()) == ["rope-s1"]


# ----------------------------------------------------------------------------------------------------------------
# The pure aggregation of one experiment's seeds.


def test_mean_and_sample_sd() -> None:
    assert mean_sd([0.2, 0.4, 0.9]) == (pytest.approx(0.5), pytest.approx(math.sqrt(0.13)))
    assert mean_sd([0.7]) == (pytest.approx(0.7), None)


def test_the_row_state_is_learned_only_when_every_seed_is() -> None:
    assert row_state([LEARNED, LEARNED]) == LEARNED
    assert row_state([LEARNED, NOT_LEARNED]) == NOT_LEARNED
    assert row_state([LEARNED, NOT_MEASURED, NOT_LEARNED]) == NOT_MEASURED
    assert row_state([NOT_MEASURED, NOT_TRAINED]) == NOT_TRAINED  # "not trained" names a row first
    assert comparable([LEARNED, NOT_LEARNED]) and comparable([NOT_TRAINED, NOT_TRAINED])
    assert not comparable([NOT_TRAINED, LEARNED])


def test_seeds_in_different_states_are_never_averaged() -> None:
    seeds = [Seed(LEARNED, 1.0, {N: (1.0, 1.0)}), Seed(NOT_TRAINED, 0.2, {N: (1.0, 0.2)})]
    (row,) = aggregate("rope", "niah-single", "contains", seeds)
    assert row["competence"] == NOT_TRAINED and row["n_learned"] == 1 and row["measured"] == 2
    assert row["mean"] is None and row["sd"] is None and row["in_distribution"] is None
    (alike,) = aggregate("rope", "niah-single", "contains", [Seed(NOT_LEARNED, 0.5, {N: (1.0, 0.5)}), seeds[0]])
    assert (alike["mean"], alike["competence"], alike["in_distribution"]) == (0.75, NOT_LEARNED, 0.75)
