"""Reference tables: the ALiBi paper's Table 2 as data, posenc's ratios beside it, and the seed-aware 'best' rule."""

from __future__ import annotations

import pytest

from posenc_cli.errors import ConfigError
from posenc_cli.report.reference_tables import (
    ALIBI_TABLE2,
    length_notes,
    posenc_ratios,
    reference_table,
    separated_best,
    side_by_side,
)


def test_alibi_table2_numbers_and_ratios() -> None:
    """Press et al. 2022 (arXiv:2108.12409), Table 2: ratios at 8512 / 512 are 15.2, 2.74, 2.19 and 0.93."""
    t = reference_table("alibi-table2")
    assert t is ALIBI_TABLE2 and "2108.12409" in t.citation and t.train_length == 512
    assert [round(m, 2) for m in t.multiples] == [1.0, 1.98, 4.91, 8.81, 16.62, 30.3]
    at_16 = {s: round(t.ratios(s)[4], 2) for s in t.rows}
    assert at_16 == {"sinusoidal": 15.24, "rope": 2.74, "t5": 2.19, "alibi": 0.93}
    assert t.ratios("t5")[5] is None  # out of memory in the paper
    with pytest.raises(ConfigError, match="alibi-table2"):
        reference_table("nope-table")


def entry(multiple: float, ppl: float) -> dict:
    return {"multiple": multiple, "ppl": ppl, "status": "ok"}


def test_side_by_side_matches_multiples_and_aggregates_seeds() -> None:
    results = [
        {"label": "rope", "scheme": "rope", "entries": [entry(1.0, 10.0), entry(1.98, 12.0), entry(16.6, 30.0)]},
        {"label": "rope", "scheme": "rope", "entries": [entry(1.0, 10.0), entry(1.98, 14.0), entry(16.6, 30.0)]},
        {"label": "nope", "scheme": "nope", "entries": [entry(1.0, 10.0)]},  # not in the paper's table
    ]
    ratios = posenc_ratios(results, ALIBI_TABLE2.multiples)
    assert ratios["rope"]["ratios"][1] == pytest.approx([1.2, 1.4])
    assert ratios["rope"]["ratios"][2] == []  # 4.9x not measured
    headers, rows = side_by_side(ALIBI_TABLE2, results)
    assert headers[:3] == ["run", "scheme", "1× (512)"] and len(headers) == 8
    assert [r[0] for r in rows] == ["rope"]
    rope = rows[0]
    assert rope[2] == "1.000 ± 0.000 / 1.00"
    assert rope[3] == "1.300 ± 0.141 / 1.06"  # mean ± std over the two seeds / the paper's 21.37 / 20.07
    assert rope[4].startswith("– / ")
    assert rope[6] == "3.000 ± 0.000 / 2.74"


def test_best_only_when_separated_by_more_than_the_seed_spread() -> None:
    assert separated_best({"a": (1.0, 0.1), "b": (1.5, 0.1)}) == "a"
    assert separated_best({"a": (1.0, 0.3), "b": (1.5, 0.3)}) is None  # intervals overlap
    assert separated_best({"a": (1.0, None), "b": (1.01, None)}) == "a"  # one seed: no spread to beat
    assert separated_best({"a": (1.0, 0.0), "b": (1.0, 0.0)}) is None  # a tie is no winner
    assert separated_best({"a": (2.0, 0.1), "b": (1.0, 0.1)}, lower_is_better=False) == "a"
    assert separated_best({"a": (float("nan"), None)}) is None


def test_another_length_than_the_papers_is_marked_and_said() -> None:
    """posenc's 2× stood under the paper's 1.98× (1012 / 512) without a word; 1.98 itself is the same length."""
    results = [{"label": "rope", "scheme": "rope", "entries": [entry(1.0, 10.0), entry(2.0, 12.0), entry(4.9, 15.0)]}]
    _, rows = side_by_side(ALIBI_TABLE2, results)
    assert rows[0][3] == "1.200* / 1.06" and rows[0][4] == "1.500 / 1.57"  # 4.9 vs 4.906: within 0.5%
    notes = length_notes(ALIBI_TABLE2, results)
    assert len(notes) == 1 and "posenc measured 2× under the paper's 1.98× (1012 tokens at L = 512)" in notes[0]
    aligned = [{"label": "rope", "scheme": "rope", "entries": [entry(1.0, 10.0), entry(1.98, 12.0)]}]
    assert length_notes(ALIBI_TABLE2, aligned) == [] and "*" not in side_by_side(ALIBI_TABLE2, aligned)[1][0][3]
