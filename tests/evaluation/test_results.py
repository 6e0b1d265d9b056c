"""The results file eval/extrapolate.json: entry keys, merge in place under the lock, safe reading."""

from __future__ import annotations

from pathlib import Path

import pytest

from posenc_cli.errors import CheckpointError
from posenc_cli.evaluation import results as er
from posenc_cli.fsutil import atomic_write_json

CKPT = {"step": 1, "model_sha256": "a" * 64}


def merged(path: Path, *entries: dict) -> list[dict]:
    """The stored entries after merging `entries` one at a time, as every evaluation writes them."""
    for entry in entries:
        doc = er.update_results_file(path, "eval-extrapolate", {}, [entry], key=er.entry_key, checkpoint=CKPT)
    return doc["entries"]


def test_update_replaces_the_same_key_in_place_and_appends_others(tmp_path: Path) -> None:
    base = {"protocol": "nonoverlap", "stride": None, "length": 8, "tokens": 64, "dtype": "fp32", "checkpoint": CKPT}
    path = tmp_path / "extrapolate.json"
    a, b = {**base, "data": {"fingerprint": "a"}}, {**base, "data": {"fingerprint": "b"}}
    assert [e["ppl"] for e in merged(path, {**a, "ppl": 1.0}, {**a, "ppl": 2.0})] == [2.0]
    merged(path, {**a, "dtype": "bf16", "ppl": 3.0})
    stored = merged(path, {**b, "ppl": 4.0}, {**a, "ppl": 5.0})
    assert [e["ppl"] for e in stored] == [5.0, 3.0, 4.0]


def test_load_results_errors(tmp_path: Path) -> None:
    assert er.load_results(tmp_path, missing_ok=True) is None
    with pytest.raises(CheckpointError, match="does not exist"):
        er.load_results(tmp_path)
    er.results_path(tmp_path).parent.mkdir()
    er.results_path(tmp_path).write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        er.load_results(tmp_path)


def test_read_results_file_refuses_other_documents(tmp_path: Path) -> None:
    path = tmp_path / "extrapolate.json"
    path.write_text('{"runs": []}')
    with pytest.raises(CheckpointError, match="not an eval-extrapolate results file"):
        er.read_results_file(path, "eval-extrapolate")
    path.write_text('{"schema_version": 99, "entries": []}')
    with pytest.raises(CheckpointError, match="schema_version 99 is not 1"):
        er.read_results_file(path, "eval-extrapolate")
    doc = er.new_results_doc("r", "rope", 128, 128)
    atomic_write_json(er.results_path(tmp_path), doc)
    assert er.read_results_file(er.results_path(tmp_path), "eval-extrapolate") == doc


def test_window_scores_are_token_weighted() -> None:
    import math

    import torch

    from posenc_cli.evaluation.results import window_scores

    scores = window_scores(torch.tensor([2.0, 4.0], dtype=torch.float64), n_windows=2, stride=2, n_bytes=8)
    assert scores["tokens"] == 4 and scores["windows"] == 2 and scores["stride"] == 2
    assert scores["nll"] == 1.5 and math.isclose(scores["ppl"], math.exp(1.5))
    assert math.isclose(scores["bpb"], 6.0 / (math.log(2) * 8)) and scores["per_position"] == [1.0, 2.0]
    overflow = window_scores(torch.tensor([2000.0], dtype=torch.float64), n_windows=1, stride=1, n_bytes=0)
    assert overflow["ppl"] == math.inf and overflow["bpb"] is None


def test_key_holds_corpus_name_positions_and_precision_and_old_entries_read_as_they_were(tmp_path: Path) -> None:
    base = {"protocol": "nonoverlap", "stride": None, "length": 8, "tokens": 64, "dtype": "fp32", "checkpoint": CKPT}
    old = {**base, "data": {"name": "stdlib", "fingerprint": "a"}}  # written before `positions` was recorded
    sequential = {**old, "positions": {"mode": "sequential"}}
    assert er.entry_key(old) == er.entry_key(sequential) and er.positions_key(old) == ("sequential", None, None)
    random = {**old, "positions": {"mode": "random", "range": 64, "seed": 0}}
    renamed = {**old, "data": {"name": "text:held_out.txt", "fingerprint": "a"}}
    bf16 = {**old, "dtype": "bf16"}
    keys = {er.entry_key(e) for e in (old, random, renamed, bf16)}
    assert len(keys) == 4
    assert len({er.cell_group(e) for e in (old, {**old, "length": 16, "tokens": 128})}) == 1  # one row, two lengths
    stored = merged(tmp_path / "extrapolate.json", old, random, renamed, bf16, sequential)
    assert stored == [sequential, random, renamed, bf16]  # four cells; `sequential` replaced `old`, its same key


def test_cell_status_tells_old_na_entries_apart() -> None:
    def old(reason: str) -> dict:
        return {"status": "n/a", "reason": reason}

    assert er.cell_status(old("scheme 'learned' supports at most 16 positions")) == "n/a"
    assert er.cell_status(old("validation split has 40 tokens; one window needs 65")) == "too_few_tokens"
    assert er.cell_status(old("shorter than the fixed target of 8 tokens")) == "shorter_than_target"
    assert er.cell_status(old("non-finite loss (mean NLL inf)")) == "non_finite"
    assert er.cell_status({"status": "too_few_tokens", "reason": "x"}) == "too_few_tokens"
    assert er.cell_status({"status": "ok"}) == "ok"
