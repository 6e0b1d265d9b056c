"""The synthetic tasks of issue #44 (MQAR, flip-flop, S5/A5 word problems, the Chomsky-hierarchy tasks): each solver
gives the reference's outputs on the examples its docstring works through, each generator draws with the reference's
statistics (chi-square on a fixed seed), and an oracle built on the solvers scores 100% through posenc's scoring
(`evaluate_cell`: greedy for answer tasks, teacher-forced for the many-position ones), one wrong value less; a tiny
CLI run trains on `data=algorithmic data.tasks=[mqar]` and `posenc eval-algorithmic` scores it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from torch import nn
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.config import ModelConfig
from posenc_cli.data.algorithmic import registry, task_class
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example
from posenc_cli.data.algorithmic.mqar import KV_PAIRS, gap_probabilities
from posenc_cli.data.algorithmic.state_tracking import elements, is_even
from posenc_cli.data.tokenizer import ByteTokenizer
from posenc_cli.errors import LengthBeyondScheme
from posenc_cli.evaluation.algorithmic import cell_examples, evaluate_cell
from posenc_cli.evaluation.positions import BeyondRange, Positions
from posenc_cli.model import GPT
from posenc_cli.positional import config_class

SYNTHETIC = sorted(name for name, task in registry().items() if task.suite == "synthetic")
CHOMSKY = [
    "binary_addition",
    "bucket_sort",
    "cycle_navigation",
    "duplicate_string",
    "even_pairs",
    "missing_duplicate",
    "modular_arithmetic",
    "stack_manipulation",
]


def test_the_issue_tasks_are_registered() -> None:
    assert set(SYNTHETIC) == {"mqar", "flipflop", "flipflop_sparse", "flipflop_dense", "s5", "a5", *CHOMSKY}


def _solve(name: str, inputs: str) -> str:
    return task_class(name).solve(f"{name}: {' '.join(inputs)} =").replace(" ", "")


@pytest.mark.parametrize(
    ("name", "inputs", "output"),
    [  # the reference's docstring examples (randomized_positional_encodings 57bc5d0, tasks/*)
        ("even_pairs", "001110", "0"),
        ("even_pairs", "0101001", "1"),
        ("cycle_navigation", "20100", "3"),  # 1 -1 0 -1 -1 -> class 3
        ("cycle_navigation", "2220", "2"),  # 1 1 1 -1 -> 2
        ("modular_arithmetic", "1+2*3", "2"),
        ("modular_arithmetic", "1-1-1", "4"),
        ("modular_arithmetic", "0*1+4*3-2", "0"),
        ("stack_manipulation", "0110422", "1102"),  # 0 1 1 0 PUSH 1 POP POP
        ("stack_manipulation", "110222", "2"),  # 1 1 0 POP POP POP
        ("binary_addition", "001+01101", "010112"),  # 4 + 22 = 26
        ("binary_addition", "1001+000001", "1001012"),  # 9 + 32 = 41
        ("missing_duplicate", "01100210", "1"),
        ("missing_duplicate", "1011213", "0"),
        ("bucket_sort", "10204112", "00111224"),
        ("duplicate_string", "101", "101101"),
    ],
)
def test_chomsky_solvers_give_the_references_worked_examples(name: str, inputs: str, output: str) -> None:
    assert _solve(name, inputs) == output


def _inputs(example: Example) -> list[str]:
    return example.prompt.split(": ", 1)[1].removesuffix(" =").split(" ")


def _uniform(counts: Counter, support: list) -> float:
    return float(chisquare([counts[s] for s in support]).pvalue)


def test_chomsky_generators_draw_the_references_statistics() -> None:
    rng = np.random.default_rng(0)
    symbols = {"even_pairs": "01", "cycle_navigation": "012", "bucket_sort": "01234", "duplicate_string": "01"}
    for name, alphabet in symbols.items():
        counts = Counter(t for _ in range(300) for t in _inputs(task_class(name).sample(rng, 20)))
        assert _uniform(counts, list(alphabet)) > 1e-3, (name, counts)
    expr = [_inputs(task_class("modular_arithmetic").sample(rng, 10)) for _ in range(500)]  # even: 9 tokens
    assert {len(e) for e in expr} == {9}
    assert _uniform(Counter(t for e in expr for t in e[::2]), list("01234")) > 1e-3
    assert _uniform(Counter(t for e in expr for t in e[1::2]), list("+*-")) > 1e-3
    stacks = [_inputs(task_class("stack_manipulation").sample(rng, 12)) for _ in range(1100)]
    depths = Counter(next(i for i, t in enumerate([*s, "2"]) if t in "234") for s in stacks)
    assert set(depths) <= set(range(1, 12)) and _uniform(depths, list(range(1, 12))) > 1e-3  # U{1..n-1}
    sums = [_inputs(task_class("binary_addition").sample(rng, 12)) for _ in range(1000)]
    firsts = Counter(s.index("+") for s in sums)
    assert all(len(s) == 12 for s in sums) and _uniform(firsts, list(range(1, 11))) > 1e-3  # U{1..n-2}
    hidden = Counter(_inputs(task_class("missing_duplicate").sample(rng, 9)).index("2") for _ in range(800))
    assert _uniform(hidden, list(range(8))) > 1e-3  # uniform over 2 * (9 // 2) positions, then the pad
    assert _inputs(task_class("missing_duplicate").sample(rng, 9))[-1] == "3"
    assert task_class("missing_duplicate").sample(rng, 1).text == "missing_duplicate: 1 = 1"


def test_mqar_layout_is_zoologys() -> None:
    task = task_class("mqar")
    rng = np.random.default_rng(0)
    first_gaps: Counter = Counter()
    for _ in range(2000):
        e = task.sample(rng, 28)  # Figure 2's (L, kv) = (64, 4)
        tokens = e.text.split(" ")[1:]
        context, region = tokens[: 2 * KV_PAIRS], tokens[2 * KV_PAIRS :]
        keys, values = context[::2], context[1::2]
        assert len(set(keys)) == len(set(values)) == KV_PAIRS and all(k.islower() for k in keys)
        assert all(v.isupper() for v in values) and len(region) % 2 == 0 and len(region) <= 2 * 28
        slots = [tuple(region[i : i + 2]) for i in range(0, len(region), 2)]
        assert sorted(s for s in slots if s != ("0", "0")) == sorted(zip(keys, values, strict=True))
        assert slots[-1] != ("0", "0")  # the document ends with the last query's value
        scored = [text.strip() for text, s in e.pieces if s]
        assert scored == [v for _, v in slots if v != "0"] and e.answer == f" {scored[-1]}"
        first_gaps[slots.index((keys[0], values[0]))] += 1
    # the first key's gap is the first draw: P(g) ∝ a (g + 1)^(a - 1), a = 0.01 (multiquery_ar.py:115-120)
    p = gap_probabilities(28)
    observed = [first_gaps[g] for g in range(28)]
    assert chisquare(observed, 2000 * p).pvalue > 1e-3
    assert first_gaps[0] > first_gaps[27]  # most queries right after the context


@pytest.mark.parametrize(("name", "p_ignore"), [("flipflop", 0.8), ("flipflop_sparse", 0.98), ("flipflop_dense", 0.1)])
def test_flipflop_draws_ffl_p(name: str, p_ignore: float) -> None:
    rng = np.random.default_rng(1)
    ops: Counter = Counter()
    for _ in range(100):
        e = task_class(name).sample(rng, 64)
        tokens = e.text.split(" ")[1:]
        assert len(tokens) == 128 and tokens[0] == "w" and tokens[-2] == "r"
        ops.update(tokens[2:-2:2])  # the freely drawn instructions
        memory, reads = None, []
        for op, bit in zip(tokens[::2], tokens[1::2], strict=True):
            memory = bit if op == "w" else memory
            reads += [bit] if op == "r" else []
            assert op != "r" or bit == memory
        assert [text.strip() for text, s in e.pieces if s] == reads
    expected = np.array([p_ignore, (1 - p_ignore) / 2, (1 - p_ignore) / 2]) * sum(ops.values())
    assert chisquare([ops["i"], ops["w"], ops["r"]], expected).pvalue > 1e-3


@pytest.mark.parametrize(("name", "size"), [("s5", 120), ("a5", 60)])
def test_word_problems_draw_uniform_elements_of_the_group(name: str, size: int) -> None:
    group = elements(name.upper())
    assert len(group) == size and group[0] == (0, 1, 2, 3, 4)
    assert all(is_even(g) for g in group) == (name == "a5")
    rng = np.random.default_rng(2)
    counts: Counter = Counter()
    for _ in range(600):
        e = task_class(name).sample(rng, 10)
        words = e.prompt.split(" ")[1:-1]
        assert len(words) == 10 and e.prompt.endswith(" =") and len(e.answer) == 6
        counts.update(words)
    assert _uniform(counts, ["".join(map(str, g)) for g in group]) > 1e-3


def test_word_problem_product_order() -> None:
    # the swap (0 1), then the swap (1 2): 0 -> 1 -> 2, 1 -> 0 -> 0, 2 -> 2 -> 1 (p·x applies p first)
    assert task_class("s5").solve("S5: 10234 02134 =") == " 20134"
    assert task_class("s5").solve("S5: 10234 =") == " 10234"
    with pytest.raises(ValueError, match="not a a5 prompt"):
        task_class("a5").solve("A5: 10234 =")  # a transposition is odd


# ----------------------------------------------------------------------------------------------------------------
# Scoring through posenc's evaluation.


class SolverModel(nn.Module):
    """Predicts at every position the next token the task's solver implies: after a prompt ending ` =` (greedy
    tasks) the answer's characters then end-of-document; at a query (MQAR's key, flip-flop's `r`) the space and the
    solver's symbol; elsewhere anything (unscored). `wrong`: the symbol of the first query of each document is off."""

    def __init__(self, task: type[AlgorithmicTask], wrong: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))  # the evaluation reads the device off a parameter
        self.task, self.wrong = task, wrong
        self.tok = ByteTokenizer()

    def next_token(self, prefix: str) -> tuple[int, bool]:
        """(the token after `prefix`, whether it is a query's symbol)."""
        if " =" in prefix:
            prompt, _, made = prefix.rpartition(" =")
            answer = self.task.solve(prompt + " =")
            return (ord(answer[len(made)]) if len(made) < len(answer) else self.tok.eod_id), False
        for cut in (0, 1):  # the prefix ends at a query, or one space after it
            try:
                return ord(self.task.solve(prefix[: len(prefix) - cut])[cut]), cut == 1
            except ValueError:
                continue
        return ord("?"), False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*x.shape, self.tok.vocab_size)  # (B, T, V)
        for b, row in enumerate(x.tolist()):
            text, spoiled = self.tok.decode(row[1:]), not self.wrong  # after the leading end-of-document token
            for t in range(x.shape[1]):
                nxt, symbol = self.next_token(text[:t])
                if symbol and not spoiled:
                    nxt, spoiled = ord("?"), True
                logits[b, t, nxt] = 1.0
        return logits


@pytest.mark.parametrize("name", SYNTHETIC)
def test_the_solver_scores_every_cell_right(name: str) -> None:
    task = task_class(name)
    lengths = [task.min_length, 7] if name != "mqar" else [3, 9]
    for n in lengths:
        examples = cell_examples(name, n, 4, seed=0)
        cell = evaluate_cell(SolverModel(task), ByteTokenizer(), examples)
        assert cell["accuracy"] == 1.0 and cell["token_accuracy"] == 1.0 and cell["correct"] == 4, cell


@pytest.mark.parametrize("name", ["mqar", "flipflop_dense"])
def test_many_position_tasks_score_each_query(name: str) -> None:
    """One wrong value per document: no example is all right, the per-query accuracy loses one query in each."""
    examples = cell_examples(name, 9, 4, seed=0)
    queries = [sum(s for _, s in e.pieces) for e in examples]
    cell = evaluate_cell(SolverModel(task_class(name), wrong=True), ByteTokenizer(), examples)
    assert cell["accuracy"] == 0.0 and cell["correct"] == 0
    assert cell["token_accuracy"] == pytest.approx(1 - len(examples) / sum(queries))
    assert cell["samples"][0]["answer"] == "".join(t for t, s in examples[0].pieces if s)


def test_many_position_cells_refuse_what_the_scheme_cannot_read() -> None:
    examples = cell_examples("flipflop", 40, 2, seed=0)  # 164 tokens read
    learned = GPT(ModelConfig(d_model=32, n_layer=1, n_head=2), config_class("learned")(name="learned"), 257, 24)
    with pytest.raises(LengthBeyondScheme, match="at most 24 positions"):
        evaluate_cell(learned, ByteTokenizer(), examples)
    rope = GPT(ModelConfig(d_model=32, n_layer=1, n_head=2), config_class("rope")(name="rope"), 257, 24)
    with pytest.raises(BeyondRange, match="at most 100 tokens"):
        evaluate_cell(rope, ByteTokenizer(), examples, positions=Positions(mode="random", range=100, seed=0))
    cell = evaluate_cell(rope, ByteTokenizer(), examples, positions=Positions(mode="random", range=512, seed=0))
    assert cell["tokens"] == 165 and 0.0 <= cell["token_accuracy"] <= 1.0


# ----------------------------------------------------------------------------------------------------------------
# From the CLI.

runner = CliRunner()


def test_train_on_mqar_then_eval_algorithmic(tmp_path: Path) -> None:
    run = tmp_path / "run"
    tiny = ["model=tiny", "model.d_model=32", "model.n_layer=1", "model.n_head=2", "train.seq_len=64"]
    data = ["data=algorithmic", "data.tasks=[mqar]", "data.examples=100", "data.max_length=6"]
    trained = runner.invoke(app, ["train", *tiny, *data, "train.steps=2", "train.batch_size=2", "--out", str(run)])
    assert trained.exit_code == 0, trained.output
    out = tmp_path / "alg.json"
    args = [str(run), "--examples", "2", "--lengths", "6,12", "--device", "cpu", "--json", str(out)]
    scored = runner.invoke(app, ["eval-algorithmic", *args], terminal_width=200)
    assert scored.exit_code == 0, scored.output
    entries = json.loads(out.read_text())["runs"][0]["entries"]
    assert [(e["task"], e["length"], e["in_distribution"]) for e in entries] == [("mqar", 6, True), ("mqar", 12, False)]
    assert all(e["status"] == "ok" and 0.0 <= e["token_accuracy"] <= 1.0 for e in entries)
    args = [str(run), "--tasks", "flipflop", "--examples", "1", "--lengths", "1,2", "--json", str(out)]
    scored = runner.invoke(app, ["eval-algorithmic", *args], terminal_width=200)
    assert scored.exit_code == 0, scored.output
    entries = json.loads(out.read_text())["runs"][0]["entries"]
    assert [(e["task"], e["length"]) for e in entries] == [("flipflop", 2)]  # no flip-flop of one instruction


TINY_TASK = [
    "model=tiny",
    "model.d_model=32",
    "model.n_layer=1",
    "model.n_head=2",
    "train.seq_len=24",
    "train.steps=3",
    "train.warmup_steps=1",
    "train.batch_size=4",
    "train.eval_every=3",
    "train.save_every=3",
    "train.precision=fp32",
    "train.threads=1",
    "train.loss_on=answer",
    "train.packing=none",
    "data=algorithmic",
    "data.tasks=[flipflop]",
    "data.examples=64",
    "data.max_length=4",
    "data.eval_examples=3",
    "eval.lengths=[1]",
    "pos=rope",
]


def stored_cells(run: Path) -> list[tuple]:
    """A run's stored algorithmic cells, without when and by which version they were written."""
    entries = json.loads((run / "eval" / "algorithmic.json").read_text())["entries"]
    return [tuple((k, json.dumps(v)) for k, v in e.items() if k not in ("created", "posenc_version")) for e in entries]


@pytest.mark.integration  # a sweep run
def test_a_synthetic_task_gives_the_same_cells_from_the_cli_the_api_and_a_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #44: flip-flop trained on its read bits and scored per length (1..2L) from the three entry points."""
    from posenc_cli import api

    monkeypatch.chdir(tmp_path)
    cli_run, api_run, sweep_dir = tmp_path / "cli", tmp_path / "api", tmp_path / "sweep"
    trained = runner.invoke(app, ["train", *TINY_TASK, "--out", str(cli_run)])
    assert trained.exit_code == 0, trained.output
    scored = runner.invoke(app, ["eval-algorithmic", str(cli_run), "--device", "cpu", "--threads", "1"])
    assert scored.exit_code == 0, scored.output

    api.train(TINY_TASK, out=api_run, progress=False)
    api.evaluate_algorithmic([api_run], device="cpu", threads=1)

    (tmp_path / "cfg" / "sweep").mkdir(parents=True)
    stage = "stages:\n  - name: train\n    params: {pos: rope}\n"
    (tmp_path / "cfg" / "sweep" / "one.yaml").write_text(f"overrides: {json.dumps(TINY_TASK[:-1])}\n{stage}")
    api.sweep("one", [], out=sweep_dir, config_dir=tmp_path / "cfg")

    cells = stored_cells(cli_run)
    assert [dict(c)["length"] for c in cells] == [str(n) for n in range(2, 9)]  # 1..2L, no flip-flop of length 1
    assert cells == stored_cells(api_run) == stored_cells(sweep_dir / "train" / "default")
