"""benchmarks/answer_length.py: item spans, and its four measures on oracle models whose answers are known."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from benchmark_scripts import load_benchmark
from torch import nn

from posenc_cli.data.algorithmic.copy import Copy
from posenc_cli.data.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def al() -> ModuleType:
    return load_benchmark("answer_length")


class CopyOracle(nn.Module):
    """Predicts the right next token of a copy answer at every position; with `cap`, ends the answer after `cap`
    items instead of going on (a model that learned the longest training length as the answer's length)."""

    def __init__(self, cap: int | None = None) -> None:
        super().__init__()
        self.cap = cap

    def next_token(self, ids: list[int]) -> int:
        text = TOK.decode([i for i in ids if i != TOK.eod_id])
        prompt, sep, written = text.partition("[SEP]")
        if not sep:
            return TOK.encode(" ")[0]
        answer = Copy.solve(prompt + sep)
        if self.cap is not None and len(written.split()) == self.cap and not written.endswith(" "):
            return TOK.eod_id
        full = [*TOK.encode(answer).tolist(), TOK.eod_id]
        done = TOK.encode(written).tolist() if written else []
        return full[len(done)] if len(done) < len(full) else TOK.eod_id

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        logits = torch.full((B, T, TOK.vocab_size), -20.0)  # (B, T, V)
        for b in range(B):
            for t in range(T):
                logits[b, t, self.next_token(idx[b, : t + 1].tolist())] = 20.0
        return logits


def test_item_spans_hold_each_item_with_its_space(al: ModuleType) -> None:
    assert al.item_spans(TOK, " a 7 Q") == [(0, 2), (2, 4), (4, 6)]


def test_count_items_stops_at_the_end_token(al: ModuleType) -> None:
    ids = torch.tensor([*TOK.encode(" a b"), TOK.eod_id, *TOK.encode(" c")]).numpy()
    assert al.count_items(ids, TOK) == 2


def test_a_model_that_copies_scores_every_measure(al: ModuleType) -> None:
    cell = al.diagnose_cell(CopyOracle(), TOK, "copy", 5, 3, 0, cap=4)
    assert cell["written"] == {5: 3}
    assert cell["item_accuracy"] == [1.0] * 5
    assert cell["end_after_last"] == 1.0
    assert cell["end_after_L"] == pytest.approx(0.0, abs=1e-6)  # the answer goes on after item 4, and so does it


def test_a_model_that_stops_at_its_training_length_is_caught(al: ModuleType) -> None:
    cell = al.diagnose_cell(CopyOracle(cap=4), TOK, "copy", 5, 3, 0, cap=4)
    assert cell["written"] == {4: 3}  # greedy: four items, then the end
    assert cell["end_after_L"] == pytest.approx(1.0)
    assert cell["item_accuracy"][:4] == [1.0] * 4 and cell["item_accuracy"][4] == 0.0  # its space is the end
    within = al.diagnose_cell(CopyOracle(cap=4), TOK, "copy", 4, 3, 0, cap=4)
    assert within["end_after_L"] is None and within["end_after_last"] == 1.0  # n <= L: nothing to cap


def test_a_missing_run_is_one_line_and_exit_2(al: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert al.main([str(tmp_path / "nothing"), "--lengths", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
