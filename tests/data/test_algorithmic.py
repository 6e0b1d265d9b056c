"""The algorithmic suite's tasks as the reference defines them, the `data=algorithmic` source, and the evaluation:
an oracle model that answers every prompt right scores 100% through the real decoding path, one that never stops
scores 0%; cells are stored, reused, measured again for a new checkpoint, n/a beyond a scheme's positions."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from posenc_cli.config import Config, ModelConfig, TrainConfig
from posenc_cli.data.algorithmic import task_class
from posenc_cli.data.algorithmic.base import GENERATOR_VERSION, SORT_SYMBOLS, number_to_string, random_number
from posenc_cli.data.sources import open_source
from posenc_cli.data.sources.algorithmic import AlgorithmicDataConfig, make_documents
from posenc_cli.data.sources.stdlib import StdlibDataConfig
from posenc_cli.data.tokenizer import ByteTokenizer
from posenc_cli.errors import CheckpointError, ConfigError
from posenc_cli.evaluation.algorithmic import (
    ALGORITHMIC_FILE,
    AlgorithmicEvalConfig,
    cell_examples,
    encode_example,
    summarize,
)
from posenc_cli.evaluation.results import checkpoint_identity
from posenc_cli.evaluation.tasks import registry as eval_registry
from posenc_cli.evaluation.tasks.algorithmic import evaluate_algorithmic_run
from posenc_cli.model import GPT
from posenc_cli.positional import config_class
from posenc_cli.run.config_compose import compose_dict
from posenc_cli.run.config_load import config_from_dict
from posenc_cli.run.interrupts import run_lock
from posenc_cli.run.load import LoadedRun
from posenc_cli.run.meta import RunMeta

# ----------------------------------------------------------------------------------------------------------------
# Tasks: the reference's definitions.


def test_number_to_string_is_the_references() -> None:
    assert number_to_string(-120) == "- 1 2 0" and number_to_string(7) == "7" and number_to_string(0) == "0"


def test_random_number_has_exactly_its_digits() -> None:
    rng = np.random.default_rng(0)
    assert {len(str(random_number(rng, 1))) for _ in range(50)} == {1}
    assert 0 in {random_number(rng, 1) for _ in range(200)}  # one digit includes 0, as in the reference
    assert all(len(str(random_number(rng, d))) == d for d in (2, 19, 40) for _ in range(20))  # past int64 too


def _operand_pairs(examples: list) -> set[tuple[int, int]]:
    found = [re.fullmatch(r"Compute ([\d ]+) \+ ([\d ]+) \?", e.prompt).groups() for e in examples]  # type: ignore[union-attr]
    return {(len(a.split()), len(b.split())) for a, b in found}


def test_addition_length_is_the_longer_operand() -> None:
    rng, task = np.random.default_rng(0), task_class("addition")
    every = _operand_pairs([task.sample_in(rng, 4, 1) for _ in range(400)])
    assert every == {(4, k) for k in range(1, 5)} | {(k, 4) for k in range(1, 5)}  # every pair with max 4
    builders = _operand_pairs([task.sample(rng, 6) for _ in range(400)])  # the builder's operands of >= 4 digits
    assert builders == {(6, k) for k in range(4, 7)} | {(k, 6) for k in range(4, 7)}


def test_texts_are_the_references() -> None:
    rng = np.random.default_rng(0)
    copy = task_class("copy").sample(rng, 3)
    assert re.fullmatch(r"Copy: \w \w \w \[SEP\] \w \w \w", copy.text)
    parity = task_class("parity").solve("Is the number of 1's even in the sequence [ 1, 0, 1 ] ?")
    assert parity == " The answer is Yes."  # even -> Yes (parity_instance_processor.py NICE_VALUES)
    assert task_class("summation").solve("Compute: 9 + 9 + 4 .[SEP]") == " The answer is 2 ."  # 22 mod 10
    poly = task_class("polynomial").solve("Evaluate at x = - 2 in 3 * x ** 2 + - 1 * x ** 0 ?")
    assert poly == " The answer is 1."  # 12 - 1 = 11, mod 10
    assert task_class("polynomial").solve("Evaluate at x = 1 in - 3 * x ** 0 ?") == " The answer is 7."  # -3 mod 10
    assert task_class("addition").solve("Compute 9 9 + 1 ?") == " The answer is 1 0 0."
    assert task_class("reverse").solve("Reverse: a b C [SEP]") == " C b a"
    assert task_class("sorting").solve("Sort the following list [ b, 3, B ].") == " The sorted list is [ 3, B, b ]."
    assert len(SORT_SYMBOLS) == 50 and list(SORT_SYMBOLS) == sorted(SORT_SYMBOLS)


# ----------------------------------------------------------------------------------------------------------------
# The data source.


def test_train_with_data_algorithmic_composes() -> None:
    raw = compose_dict(["data=algorithmic", "data.tasks=[copy,reverse]", "data.max_length=20"])
    data = config_from_dict(raw).data
    assert isinstance(data, AlgorithmicDataConfig) and data.tasks == ["copy", "reverse"] and data.max_length == 20
    assert data.test_max_length == 40


def test_documents_have_lengths_up_to_L_and_every_length(tmp_path: Path) -> None:
    data = AlgorithmicDataConfig(tasks=["copy"], examples=400, max_length=6, min_length=2, val_fraction=0.25)
    train, val, _ = open_source(data, tmp_path, None).documents()
    assert (train.count, val.count) == (300, 100)
    for docs in (train, val):
        lengths = [len(d.split(" [SEP] ")[1].split(" ")) for batch in docs.batches() for d in batch]
        assert set(lengths) == set(range(2, 7))
    texts = [d for batch in train.batches() for d in batch]
    assert texts == make_documents(data, 300, 0) and texts != make_documents(data, 300, 1)


def test_mixture_draws_every_task(tmp_path: Path) -> None:
    data = AlgorithmicDataConfig(examples=700, max_length=5)
    docs = make_documents(data, 700, 0)
    solved = {name for name in data.tasks for d in docs if _solves(name, d)}
    assert solved == set(data.tasks)


def _solves(name: str, doc: str) -> bool:
    task = task_class(name)
    for cut in [m.start() for m in re.finditer(" ", doc)]:
        try:
            if task.solve(doc[:cut]) == doc[cut:]:
                return True
        except ValueError:
            continue
    return False


def test_fingerprint_follows_the_documents_not_the_evaluation(tmp_path: Path) -> None:
    base = AlgorithmicDataConfig(examples=50)
    fp = open_source(base, tmp_path, None).fingerprint
    for change in ({"eval_examples": 7}, {"eval_max_length": 9}):
        assert open_source(dataclasses.replace(base, **change), tmp_path, None).fingerprint == fp
    for change in ({"tasks": ["copy"]}, {"max_length": 8}, {"seed": 1}, {"min_length": 2}):
        assert open_source(dataclasses.replace(base, **change), tmp_path, None).fingerprint != fp


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tasks": ["copi"]}, "did you mean 'copy'"),
        ({"tasks": []}, "at least one task"),
        ({"tasks": ["copy", "copy"]}, "names a task twice"),
        ({"max_length": 3, "min_length": 5}, "below data.min_length"),
        ({"min_length": 0}, "data.min_length must be >= 1"),
        ({"eval_examples": 0}, "data.eval_examples must be >= 1"),
        ({"max_length": 5000}, "at most 1024"),
    ],
)
def test_bad_settings_are_one_line(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AlgorithmicDataConfig(**fields).validate()


# ----------------------------------------------------------------------------------------------------------------
# Evaluation.


class Oracle(nn.Module):
    """Answers every prompt of `examples` right (then stops with end-of-document), or never stops."""

    def __init__(self, examples: list, stops: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))  # the evaluation reads the device off a parameter
        tok = ByteTokenizer()
        self.vocab = tok.vocab_size
        self.table = [tuple(map(np.ndarray.tolist, encode_example(tok, e))) for e in examples]
        self.stops = stops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*x.shape, self.vocab)  # (B, T, V)
        for b, row in enumerate(x.tolist()):
            prompt, answer = max((p, a) for p, a in self.table if row[: len(p)] == p)
            at = len(row) - len(prompt)
            nxt = answer[at] if at < len(answer) else ByteTokenizer.eod_id
            if not self.stops and nxt == ByteTokenizer.eod_id:
                nxt = ord(" ")
            logits[b, -1, nxt] = 1.0
        return logits


def _run(path: Path, model: nn.Module, data: AlgorithmicDataConfig, step: int = 10) -> LoadedRun:
    cfg = Config(model=ModelConfig(d_model=32, n_layer=1, n_head=2), data=data, train=TrainConfig(seq_len=64))
    path.mkdir(parents=True, exist_ok=True)
    meta = {"kind": "posenc-run", "train_length": 64, "step": step, "files": {"model.safetensors": "a" * 64}}
    (path / "meta.json").write_text(json.dumps(meta))
    return LoadedRun(path=path, model=model, config=cfg, meta=RunMeta.from_json(meta), tokenizer=ByteTokenizer())


def _oracle_run(tmp_path: Path, lengths: list[int], stops: bool = True) -> tuple[LoadedRun, AlgorithmicEvalConfig]:
    data = AlgorithmicDataConfig(tasks=["addition", "copy", "polynomial"], max_length=3)
    cfg = AlgorithmicEvalConfig(lengths=lengths, examples=6, seed=5)
    # L = 3 is below every builder's train_min: the runs train on length 3 alone, operands of 3 digits or more
    examples = [e for t in data.tasks for n in lengths for e in cell_examples(t, n, 6, 5, 3)]
    return _run(tmp_path / "run", Oracle(examples, stops), data), cfg


def test_an_oracle_scores_every_cell_and_the_means_split_at_L(tmp_path: Path) -> None:
    run, cfg = _oracle_run(tmp_path, [1, 2, 3, 4, 6])
    result = evaluate_algorithmic_run(run, cfg, device="cpu")
    cells = result["entries"]
    assert len(cells) == 3 * 5 and all(e["status"] == "ok" and e["accuracy"] == 1.0 for e in cells)
    assert {(e["length"], e["in_distribution"]) for e in cells} == {(1, 0), (2, 0), (3, 1), (4, 0), (6, 0)}
    assert all(
        e["correct"] == e["examples"] == 6 and e["train_max_length"] == e["train_min_length"] == 3 for e in cells
    )
    assert all(e["token_accuracy"] == 1.0 and e["measures"] == 2 for e in cells)
    summary = {s.task: s for s in summarize(cells)}
    assert summary["copy"].in_distribution == summary["copy"].beyond == 1.0
    sample = next(e for e in cells if e["task"] == "copy")["samples"][0]
    assert sample["output"] == sample["answer"]


def test_an_answer_that_does_not_stop_is_wrong(tmp_path: Path) -> None:
    run, cfg = _oracle_run(tmp_path, [2, 5], stops=False)
    cells = evaluate_algorithmic_run(run, cfg, device="cpu")["entries"]
    assert all(e["status"] == "ok" and e["accuracy"] == 0.0 for e in cells)
    # every answer token right but the closing end-of-document one: per-token accuracy (n - 1) / n per example
    tok = ByteTokenizer()
    for e in cells:
        examples = cell_examples(e["task"], e["length"], 6, 5, e["train_min_length"])
        sizes = [len(encode_example(tok, x)[1]) for x in examples]
        assert e["token_accuracy"] == pytest.approx(float(np.mean([(n - 1) / n for n in sizes])))


def test_cells_stored_before_per_token_accuracy_are_measured_again(tmp_path: Path) -> None:
    run, cfg = _oracle_run(tmp_path, [1, 4])
    evaluate_algorithmic_run(run, cfg, device="cpu")
    doc = json.loads((run.path / ALGORITHMIC_FILE).read_text())
    for e in doc["entries"]:  # as posenc wrote them before `measures`
        del e["measures"], e["token_accuracy"]
    (run.path / ALGORITHMIC_FILE).write_text(json.dumps(doc))
    again = evaluate_algorithmic_run(run, cfg, device="cpu")
    assert again["reused"] == 0 and all(e["token_accuracy"] == 1.0 for e in again["entries"])


def test_cells_of_an_older_generator_are_measured_again(tmp_path: Path) -> None:
    run, cfg = _oracle_run(tmp_path, [1, 4])
    evaluate_algorithmic_run(run, cfg, device="cpu")
    doc = json.loads((run.path / ALGORITHMIC_FILE).read_text())
    for e in doc["entries"]:  # as posenc wrote them before addition's bins and summation's '.[SEP]'
        e["generator"] = GENERATOR_VERSION - 1
        del e["train_min_length"]
    (run.path / ALGORITHMIC_FILE).write_text(json.dumps(doc))
    assert evaluate_algorithmic_run(run, cfg, device="cpu")["reused"] == 0
    assert evaluate_algorithmic_run(run, cfg, device="cpu")["reused"] == 6


def test_cells_are_stored_reused_and_measured_again_for_another_checkpoint(tmp_path: Path) -> None:
    run, cfg = _oracle_run(tmp_path, [1, 4])
    first = evaluate_algorithmic_run(run, cfg, device="cpu")
    stored = json.loads((run.path / ALGORITHMIC_FILE).read_text())
    assert len(stored["entries"]) == 6 and stored["scheme"] == run.config.pos.name
    again = evaluate_algorithmic_run(run, cfg, device="cpu")
    assert again["reused"] == 6 and again["entries"] == first["entries"]
    more = evaluate_algorithmic_run(run, dataclasses.replace(cfg, examples=3), device="cpu")
    assert more["reused"] == 0  # the number of examples is part of the key
    run.meta = dataclasses.replace(run.meta, step=20, files={"model.safetensors": "b" * 64})
    later = evaluate_algorithmic_run(run, cfg, device="cpu")
    assert later["reused"] == 0
    stored = json.loads((run.path / ALGORITHMIC_FILE).read_text())
    assert {json.dumps(e["checkpoint"]) for e in stored["entries"]} == {json.dumps(checkpoint_identity(run.meta))}
    with run_lock(run.path), pytest.raises(CheckpointError, match="being trained"):
        evaluate_algorithmic_run(run, cfg, device="cpu", force=True)


def test_learned_positions_beyond_their_table_are_n_a(tmp_path: Path) -> None:
    torch.manual_seed(0)
    data = AlgorithmicDataConfig(tasks=["copy"], max_length=4)
    model = GPT(ModelConfig(d_model=32, n_layer=1, n_head=2), config_class("learned")(name="learned"), 257, 24).eval()
    run = _run(tmp_path / "run", model, data)
    cells = evaluate_algorithmic_run(run, AlgorithmicEvalConfig(examples=2), device="cpu")["entries"]
    assert [e["length"] for e in cells] == list(range(1, 9))  # 1..2L
    # copy of n items: 1 + (6 + 2n - 1 + 6) prompt tokens + (2n + 1) answer tokens = 4n + 13 <= 24 + 1 for n <= 3
    assert [e["status"] for e in cells] == ["ok"] * 3 + ["n/a"] * 5
    assert all("supports at most 24 positions" in e["reason"] for e in cells[3:])
    assert all(0.0 <= e["accuracy"] <= 1.0 and e["tokens"] == 4 * e["length"] + 13 for e in cells[:3])


def test_the_sweep_task_measures_jobs_trained_on_algorithmic_data(tmp_path: Path) -> None:
    task = eval_registry()["algorithmic"]
    assert task.length_axis == "instance"
    data = AlgorithmicDataConfig(tasks=["copy"], max_length=2, eval_examples=3, eval_max_length=3)
    examples = [e for n in (1, 2, 3) for e in cell_examples("copy", n, 3, 0)]
    run = _run(tmp_path / "run", Oracle(examples), data)
    cells = task.evaluate_job(run, run.config, device=torch.device("cpu"))["entries"]
    assert [(e["length"], e["examples"], e["accuracy"]) for e in cells] == [(1, 3, 1.0), (2, 3, 1.0), (3, 3, 1.0)]
    other = dataclasses.replace(run.config, data=StdlibDataConfig())  # a job of another source has no cells here
    assert task.evaluate_job(run, other, device=torch.device("cpu"))["entries"] == []
    with run_lock(run.path), pytest.raises(CheckpointError, match="being trained"):
        task.evaluate_job(run, other, device=torch.device("cpu"))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"lengths": [0, 3]}, "instance lengths in"),
        ({"tasks": ["sortin"]}, "did you mean 'sorting'"),
        ({"examples": 0}, "--examples must be >= 1"),
        ({"max_length": 0}, "--max-length must be in"),
        ({"dtype": "fp16"}, "--dtype must be"),
    ],
)
def test_bad_evaluation_settings_are_one_line(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AlgorithmicEvalConfig(**fields).validate()
