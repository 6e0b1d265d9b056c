"""`analysis.mrr`: the NoPE paper's mean reciprocal rank, checked by hand on a small table, and end to end on two tiny
runs evaluated by `posenc eval-algorithmic`."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc_cli.analysis.mrr import QueryScore, mrr_table, nope_mrr
from posenc_cli.cli import app
from posenc_cli.errors import ConfigError, UserError

# (scheme, seed, task) -> beyond-L accuracy; ties broken alphabetically (alibi < nope < rope) as the reference's
# rank(method="first") breaks them by row order.
BEYOND = {
    ("nope", 0, "copy"): 0.5,
    ("rope", 0, "copy"): 0.2,
    ("alibi", 0, "copy"): 0.2,
    ("nope", 0, "reverse"): 0.0,
    ("rope", 0, "reverse"): 0.3,
    ("alibi", 0, "reverse"): 0.1,
    ("nope", 1, "copy"): 0.0,
    ("rope", 1, "copy"): 0.0,
    ("alibi", 1, "copy"): 0.0,
    ("nope", 1, "reverse"): 0.4,
    ("rope", 1, "reverse"): 0.4,
    ("alibi", 1, "reverse"): 0.5,
}


def _scores(extra: dict[tuple[str, int, str], float] | None = None) -> list[QueryScore]:
    table = {**BEYOND, **(extra or {})}
    return [
        QueryScore(scheme=s, seed=seed, task=t, max_length=8, in_distribution=1.0, beyond=b, run=f"{s}-{seed}")
        for (s, seed, t), b in table.items()
    ]


def test_mrr_matches_the_hand_computed_ranks() -> None:
    table = mrr_table(_scores()).set_index("scheme")
    assert list(table.index) == ["alibi", "nope", "rope"]  # best MRR first
    # ranks (first): s0 copy nope 1 alibi 2 rope 3; s0 reverse rope 1 alibi 2 nope 3;
    # s1 copy (all tied) alibi 1 nope 2 rope 3; s1 reverse alibi 1 nope 2 rope 3
    assert table.loc["alibi", "mrr"] == pytest.approx((1 / 2 + 1 / 2 + 1 + 1) / 4)
    assert table.loc["nope", "mrr"] == pytest.approx((1 + 1 / 3 + 1 / 2 + 1 / 2) / 4)
    assert table.loc["rope", "mrr"] == pytest.approx((1 / 3 + 1 + 1 / 3 + 1 / 3) / 4)
    # the spread is over the per-seed MRRs: nope 2/3 (seed 0) and 1/2 (seed 1)
    assert table.loc["nope", "mrr_sd"] == pytest.approx(math.sqrt((2 / 3 - 7 / 12) ** 2 + (1 / 2 - 7 / 12) ** 2))
    # average ranks for ties: s0 copy alibi/rope 2.5; s1 copy all 2; s1 reverse nope/rope 2.5
    assert table.loc["alibi", "mrr_ties_averaged"] == pytest.approx((1 / 2.5 + 1 / 2 + 1 / 2 + 1) / 4)
    assert table.loc["nope", "mrr_ties_averaged"] == pytest.approx((1 + 1 / 3 + 1 / 2 + 1 / 2.5) / 4)
    assert table.loc["rope", "mrr_ties_averaged"] == pytest.approx((1 / 2.5 + 1 + 1 / 2 + 1 / 2.5) / 4)
    assert table["ties"].to_dict() == {"alibi": 2, "nope": 2, "rope": 3}
    assert table.loc["nope", "paper"] == 0.69 and table["queries"].tolist() == [4, 4, 4]
    assert table.attrs["queries"] == 4 and table.attrs["pool"] == "paper"


def test_runs_that_did_not_learn_a_task_are_not_ranked_in_it() -> None:
    # rope did not learn copy (seed 0) in distribution, alibi was never trained on reverse (seed 1)
    scores = [
        dataclasses.replace(q, competence=0.5)
        if (q.scheme, q.seed, q.task) == ("rope", 0, "copy")
        else dataclasses.replace(q, trained=False)
        if (q.scheme, q.seed, q.task) == ("alibi", 1, "reverse")
        else q
        for q in _scores()
    ]
    table = mrr_table(scores).set_index("scheme")
    # s0 copy: nope 1, alibi 2 (rope out); s1 reverse: nope 1, rope 2 (alibi out); the others as without the gate
    assert table.loc["rope", "mrr"] == pytest.approx((1 + 1 / 3 + 1 / 2) / 3)
    assert table.loc["alibi", "mrr"] == pytest.approx((1 / 2 + 1 / 2 + 1) / 3)
    assert table.loc["nope", "mrr"] == pytest.approx((1 + 1 / 3 + 1 / 2 + 1) / 4)
    assert table["queries"].to_dict() == {"nope": 4, "alibi": 3, "rope": 3}
    assert table["not_learned"].to_dict() == {"nope": 0, "alibi": 1, "rope": 1}
    assert table.attrs["per_task"] == {"copy": (5, 1), "reverse": (5, 1)}
    assert sorted(table.attrs["excluded"]) == [
        ("alibi", 1, "reverse", 1.0, "not trained on this task"),
        ("rope", 0, "copy", 0.5, "not learned"),
    ]
    everyone = mrr_table(scores, include_unlearned=True).set_index("scheme")
    assert everyone["mrr"].to_dict() == pytest.approx(mrr_table(_scores()).set_index("scheme")["mrr"].to_dict())
    assert mrr_table(scores, competence=0.4).loc[lambda t: t["scheme"] == "rope", "queries"].item() == 4
    with pytest.raises(ConfigError, match="--competence must be an accuracy"):
        mrr_table(scores, competence=2.0)


def test_token_scores_rank_by_per_token_accuracy() -> None:
    exact = _scores()
    # per-token accuracies ordered the other way round from exact match in every query: rope > alibi > nope
    token = {"rope": 0.9, "alibi": 0.5, "nope": 0.1}
    scores = [dataclasses.replace(q, token_in_distribution=1.0, token_beyond=token[q.scheme]) for q in exact]
    table = mrr_table(scores, score="token").set_index("scheme")
    assert table["mrr"].to_dict() == {"rope": 1.0, "alibi": 0.5, "nope": pytest.approx(1 / 3)}
    assert table.loc["rope", "beyond"] == 0.9 and table.attrs["score"] == "token"
    with pytest.raises(UserError, match="no per-token accuracy"):
        mrr_table(exact, score="token")
    with pytest.raises(UserError, match="score must be one of"):
        mrr_table(exact, score="f1")


def test_pools_and_incomplete_queries() -> None:
    kerple = {("kerple", 0, "copy"): 1.0, ("kerple", 0, "reverse"): 1.0, ("kerple", 1, "copy"): 1.0}
    paper = mrr_table(_scores(kerple))
    assert "kerple" not in set(paper["scheme"])  # not one of the paper's five
    everyone = mrr_table(_scores(kerple), pool="all").set_index("scheme")
    # kerple lacks (1, reverse): only the three queries every scheme has are ranked
    assert everyone.attrs["queries"] == 3 and everyone.loc["kerple", "mrr"] == 1.0
    assert math.isnan(everyone.loc["kerple", "paper"])
    with pytest.raises(UserError, match="pool must be one of"):
        mrr_table(_scores(), pool="mine")
    with pytest.raises(UserError, match="two schemes or more"):
        mrr_table([q for q in _scores() if q.scheme == "nope"])


TINY = ["model=tiny", "model.d_model=32", "model.n_layer=1", "model.n_head=2", "train.seq_len=32"]
DATA = ["data=algorithmic", "data.tasks=[copy]", "data.examples=100", "data.max_length=2"]


def test_nope_mrr_reads_evaluated_runs(tmp_path: Path) -> None:
    runner = CliRunner()
    for pos in ("nope", "rope"):
        out = tmp_path / "sweep" / pos
        trained = runner.invoke(
            app, ["train", *TINY, *DATA, f"pos={pos}", "train.steps=2", "train.batch_size=2", "--out", str(out)]
        )
        assert trained.exit_code == 0, trained.output
    with pytest.raises(UserError, match="no eval/algorithmic.json"):
        nope_mrr([tmp_path / "sweep"])
    evaluated = runner.invoke(app, ["eval-algorithmic", str(tmp_path / "sweep"), "--examples", "2", "--device", "cpu"])
    assert evaluated.exit_code == 0, evaluated.output
    gated = nope_mrr([tmp_path / "sweep"], competence=1.0)  # two steps learn no task: both left out, and counted
    assert gated["queries"].tolist() == [0, 0] and gated["not_learned"].tolist() == [1, 1]
    assert gated["mrr"].isna().all() and gated.attrs["per_task"] == {"copy": (0, 2)}
    table = nope_mrr([tmp_path / "sweep"], include_unlearned=True)
    assert sorted(table["scheme"]) == ["nope", "rope"]
    assert table["queries"].tolist() == [1, 1] and sorted(table["mrr"]) == [0.5, 1.0]
    assert table["in_distribution"].between(0, 1).all() and table["beyond"].between(0, 1).all()
    token = nope_mrr([tmp_path / "sweep"], score="token", include_unlearned=True)
    assert token["beyond"].between(0, 1).all()
