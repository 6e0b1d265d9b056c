"""lm-evaluation-harness over posenc's forward (`posenc_cli.api.lm_eval_model`): tiny ALiBi and RoPE runs scored by
`lm_eval.simple_evaluate` offline on tasks defined here (local JSONL files), each answer equal to posenc's own
scoring of the same tokens; and the recipe for exported runs, lm-eval's own `hf` model on a `posenc export` folder."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from train_utils import write_corpus

pytest.importorskip("lm_eval")

import lm_eval
from lm_eval.api.instance import Instance
from lm_eval.tasks import TaskManager

from posenc_cli import api
from posenc_cli.api.lm_eval_model import PosencLM, continuation_scores, cut_at_stops, truncate_request
from posenc_cli.errors import ConfigError
from posenc_cli.evaluation.corpus import CorpusCache
from posenc_cli.evaluation.passkey import decode_prompts
from posenc_cli.evaluation.perplexity.measuring import evaluate_model
from posenc_cli.evaluation.positions import trained_positions
from posenc_cli.run.load import LoadedRun, load_run

pytestmark = pytest.mark.integration  # the lm-eval adapter, end to end (runs trained for it): not in the fast lane

MAX_LENGTH = 64  # the adapter's context: rolling windows of 64 tokens (the runs trained at 128)
GEN_TOKENS = 6
CHOICES = [
    {"context": "the quick brown fox jumps over a lazy", "choices": ["dog", "cat", "wizard"], "label": 0},
    {"context": "seven wizards quietly judge boxing", "choices": ["matches", "stars"], "label": 0},
    {"context": "bright stars fall into deep blue", "choices": ["water", "river"], "label": 0},
]
ROLLING = [  # 128 bytes: two windows of MAX_LENGTH, the second reading the first's last 63 tokens
    {"text": ("old river banks and bright stars fall into deep blue water under cold winter skies " * 2)[:128]},
]
PROMPTS = [{"prompt": "the quick brown fox jumps over", "answer": " a lazy dog"}, {"prompt": "seven", "answer": " w"}]


def _write_tasks(root: Path) -> Path:
    """Three tasks over local JSONL files: multiple choice (loglikelihood), rolling loglikelihood, generation."""
    tasks = root / "tasks"
    tasks.mkdir()
    kinds = {
        "choice": {
            "output_type": "multiple_choice",
            "doc_to_text": "{{context}}",
            "doc_to_choice": "{{choices}}",
            "doc_to_target": "{{label}}",
            "metric_list": [{"metric": "acc"}],
        },
        "rolling": {
            "output_type": "loglikelihood_rolling",
            "doc_to_text": "",
            "doc_to_target": "{{text}}",
            "metric_list": [{"metric": "bits_per_byte"}],
        },
        "retrieve": {
            "output_type": "generate_until",
            "doc_to_text": "{{prompt}}",
            "doc_to_target": "{{answer}}",
            "generation_kwargs": {"until": ["\n"], "max_gen_toks": GEN_TOKENS, "do_sample": False},
            "metric_list": [{"metric": "exact_match"}],
        },
    }
    docs = {"choice": CHOICES, "rolling": ROLLING, "retrieve": PROMPTS}
    for name, kind in kinds.items():
        data = tasks / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in docs[name]))
        source = {"cache_dir": str(root / "hf-cache"), "data_files": {"test": str(data)}}  # no download, no ~/.cache
        task = {"task": f"posenc_{name}", "dataset_path": "json", "dataset_kwargs": source, "test_split": "test"}
        (tasks / f"{name}.yaml").write_text(yaml.safe_dump(task | kind, sort_keys=False))
    return tasks


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """ALiBi and RoPE, `model=tiny train=quick` for 20 steps on the tiny corpus, fp32 on one thread."""
    root = tmp_path_factory.mktemp("lm-eval-runs")
    corpus = write_corpus(root)
    out = {}
    for pos in ("alibi", "rope"):
        overrides = ["model=tiny", "train=quick", "train.steps=20", f"pos={pos}", "data=text", f"data.paths=[{corpus}]"]
        overrides += ["train.device=cpu", "train.precision=fp32", "train.threads=1", "train.eval_batches=1"]
        result = api.train(overrides, out=root / pos)
        assert result.stopped_reason == "complete"
        out[pos] = result.run_dir
    return out


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_tasks(tmp_path_factory.mktemp("lm-eval-tasks"))


def _evaluate(model: str, model_args: dict[str, Any], tasks: Path, names: list[str]) -> dict[str, Any]:
    results = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=names,
        task_manager=TaskManager(include_path=str(tasks)),
        log_samples=True,
        bootstrap_iters=0,
    )
    assert results is not None
    return results


def _own_logprob(run: LoadedRun, ids: list[int], n: int) -> float:
    """posenc's own scoring (eval-extrapolate's `evaluate_model`): log p of the last `n` of `ids` given the rest, one
    window of exactly these tokens."""
    scored = evaluate_model(run.model, np.array(ids), None, length=len(ids) - 1, n_tokens=len(ids) - 1, device="cpu")
    return -float(np.sum(scored["per_position"][-n:]))


def _greedy_full(run: LoadedRun, ids: list[int], steps: int) -> list[int]:
    """Greedy tokens by full forwards, no KV cache: an independent reference for generate_until."""
    x = torch.tensor([ids])
    with torch.inference_mode():
        for _ in range(steps):
            x = torch.cat([x, run.model(x)[:, -1].argmax(-1, keepdim=True)], dim=1)  # (1, T + 1)
    return x[0, len(ids) :].tolist()


@pytest.mark.parametrize("scheme", ["alibi", "rope"])
def test_harness_scores_a_run_as_posenc_does(scheme: str, runs: dict[str, Path], tasks: Path) -> None:
    args = {"run": str(runs[scheme]), "device": "cpu", "threads": 1, "max_length": MAX_LENGTH}
    results = _evaluate("posenc", args, tasks, ["posenc_choice", "posenc_rolling", "posenc_retrieve"])
    assert results["config"]["posenc_scheme"] == scheme
    run = load_run(runs[scheme])
    eod = run.tokenizer.eod_id

    def ids(text: str) -> list[int]:
        return [int(i) for i in run.tokenizer.encode(text)]

    choice = results["samples"]["posenc_choice"]
    assert sum(len(s["resps"]) for s in choice) == 7  # every choice of every question was scored
    for sample in choice:
        for (context, continuation), ((logp, greedy),) in zip(sample["arguments"], sample["resps"], strict=True):
            cont = ids(continuation)
            own = _own_logprob(run, [eod, *ids(context), *cont], len(cont))
            assert logp == pytest.approx(own, abs=1e-5)
            assert isinstance(greedy, bool)
    assert 0.0 <= results["results"]["posenc_choice"]["acc,none"] <= 1.0

    ((sample,),) = [results["samples"]["posenc_rolling"]]
    text = ROLLING[0]["text"]
    stream = np.array([eod, *ids(text)])  # 129 tokens: eval-extrapolate's nonoverlap windows of 64 over them
    own = evaluate_model(run.model, stream, None, length=MAX_LENGTH, n_tokens=len(text), device="cpu")
    assert own["windows"] == 2
    assert sample["resps"][0][0] == pytest.approx(-own["nll"] * own["tokens"], abs=1e-5)
    bpb = results["results"]["posenc_rolling"]["bits_per_byte,none"]
    assert bpb == pytest.approx(own["nll"] * own["tokens"] / (math.log(2) * len(text)), rel=1e-6)

    for sample in results["samples"]["posenc_retrieve"]:
        (context, _gen_kwargs), ((generated,),) = sample["arguments"][0], [sample["resps"][0]]
        tokens = _greedy_full(run, [eod, *ids(context)], GEN_TOKENS)
        tokens = tokens[: tokens.index(eod)] if eod in tokens else tokens
        assert generated == run.tokenizer.decode(tokens).split("\n")[0]


@pytest.mark.parametrize("scheme", ["alibi", "rope"])
def test_loglikelihood_equals_eval_extrapolate(scheme: str, runs: dict[str, Path]) -> None:
    """One eval-extrapolate cell (a window of 64 tokens of the run's validation text) and the adapter's
    loglikelihood of the same text, without the end-of-document prefix: the same number."""
    length = 64
    evaluation = api.evaluate([runs[scheme]], abs_lengths=[length], tokens=length, device="cpu", threads=1)
    (entry,) = evaluation.results[0]["entries"]
    assert entry["status"] == "ok" and entry["tokens"] == length  # one window
    run = load_run(runs[scheme])
    window = CorpusCache().get(run.config.data, run).val[: length + 1]
    assert run.tokenizer.eod_id not in window  # plain text, so decoding and encoding again gives the same tokens
    context, continuation = run.tokenizer.decode(window[:1]), run.tokenizer.decode(window[1:])
    lm = PosencLM(run=str(runs[scheme]), device="cpu", threads=1, prefix_eod=False)
    ((logp, _),) = lm.loglikelihood([Instance("loglikelihood", {}, (context, continuation), 0)], disable_tqdm=True)
    assert logp == pytest.approx(-entry["nll"] * length, abs=1e-5)


def test_exported_run_through_lm_evals_hf_model(runs: dict[str, Path], tasks: Path, tmp_path: Path) -> None:
    """The recipe for exported runs: `--model hf` on `posenc export`'s folder scores what the posenc model scores
    (no end-of-document prefix: lm-eval's hf model adds none to a non-empty context)."""
    pytest.importorskip("transformers")
    from posenc_cli.run.export import export_run

    exported = export_run(runs["rope"], tmp_path / "hf").out_dir
    hf_args = {"pretrained": str(exported), "device": "cpu", "dtype": "float32"}
    hf = _evaluate("hf", hf_args, tasks, ["posenc_choice"])["samples"]["posenc_choice"]
    args = {"run": str(runs["rope"]), "device": "cpu", "threads": 1, "prefix_eod": False}
    own = _evaluate("posenc", args, tasks, ["posenc_choice"])["samples"]["posenc_choice"]
    for theirs, ours in zip(hf, own, strict=True):
        assert theirs["arguments"] == ours["arguments"]
        for (a, _), (b, _) in zip((r[0] for r in theirs["resps"]), (r[0] for r in ours["resps"]), strict=True):
            assert a == pytest.approx(b, abs=1e-4)


def test_randomized_positions_run_reads_its_trained_draws(tmp_path: Path) -> None:
    """A run trained with randomized positions (per-layer draws from [0, 512)) is scored at the draw eval-extrapolate
    feeds a window of the same length, not at 0..T-1."""
    corpus = write_corpus(tmp_path)
    overrides = ["model=tiny", "train=quick", "train.steps=20", "pos=rope", "train.random_positions=512", "data=text"]
    overrides += [f"data.paths=[{corpus}]", "train.device=cpu", "train.precision=fp32", "train.threads=1"]
    run_dir = api.train([*overrides, "train.eval_batches=1"], out=tmp_path / "run").run_dir
    run = load_run(run_dir)
    positions = trained_positions(run.config)
    assert positions.random and positions.layers == run.config.model.n_layer  # one draw per layer
    text = ROLLING[0]["text"][:MAX_LENGTH]
    stream = np.array([run.tokenizer.eod_id, *run.tokenizer.encode(text)])
    own = evaluate_model(run.model, stream, None, length=MAX_LENGTH, n_tokens=MAX_LENGTH, positions=positions)
    sequential = evaluate_model(run.model, stream, None, length=MAX_LENGTH, n_tokens=MAX_LENGTH)
    lm = PosencLM(run=str(run_dir), device="cpu", threads=1, max_length=MAX_LENGTH)
    (logp,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)], disable_tqdm=True)
    assert logp == pytest.approx(-own["nll"] * MAX_LENGTH, abs=1e-5)
    assert abs(logp + sequential["nll"] * MAX_LENGTH) > 1e-3  # the draw matters: 0..T-1 scores otherwise

    # generate_until: requests of different lengths share one left-padded batch, each row at the draw its length's
    # generator gives (as one prompt alone through `decode_prompts` reads it), so the texts are those of one by one
    contexts = [text[:20], text[:33], text[:20] + "x"]
    requests = [
        Instance("generate_until", {}, (c, {"until": [], "max_gen_toks": 6}), i) for i, c in enumerate(contexts)
    ]
    together = lm.generate_until(requests, disable_tqdm=True)
    eod = run.tokenizer.eod_id
    for context, got in zip(contexts, together, strict=True):
        prompt = np.array([[eod, *run.tokenizer.encode(context)]])  # (1, P)
        (alone,) = decode_prompts(run.model, prompt, 6, prompt.shape[1] + 6, 10_000, "fp32", "cpu", None, "one",
                                  positions=positions).tolist()  # fmt: skip
        alone = alone[: alone.index(eod)] if eod in alone else alone
        assert got == run.tokenizer.decode(alone)


def test_extension_and_layout_score_as_eval_extrapolate(runs: dict[str, Path], tmp_path: Path) -> None:
    """A YaRN child of the RoPE run (its 2x length) and an iRoPE layout (chunked RoPE layers, a NoPE layer with a
    position-dependent temperature) read 256 tokens, beyond their roots' 128: one rolling window each, equal to
    eval-extrapolate's window over the same tokens."""
    child = api.extend(runs["rope"], tmp_path / "yarn", method="yarn", factor=2.0).result.out_dir
    corpus = write_corpus(tmp_path)
    overrides = ["model=tiny", "train=quick", "train.steps=20", "pos=irope", "data=text", f"data.paths=[{corpus}]"]
    overrides += ["train.device=cpu", "train.precision=fp32", "train.threads=1", "train.eval_batches=1"]
    layout = api.train(overrides, out=tmp_path / "irope").run_dir
    text = (ROLLING[0]["text"] * 2)[:256]
    for run_dir in (child, layout):
        run = load_run(run_dir)
        stream = np.array([run.tokenizer.eod_id, *run.tokenizer.encode(text)])
        own = evaluate_model(run.model, stream, None, length=256, n_tokens=256)
        lm = PosencLM(run=str(run_dir), device="cpu", threads=1, max_length=256)
        (logp,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)], disable_tqdm=True)
        assert logp == pytest.approx(-own["nll"] * 256, abs=1e-5)


# -- The adapter's pieces. -----------------------------------------------------------------------------------------


def test_truncate_request_keeps_the_last_tokens() -> None:
    assert truncate_request([1, 2, 3], [4, 5], 8) == ([1, 2, 3, 4], 2)
    assert truncate_request([1, 2, 3], [4, 5], 3) == ([2, 3, 4], 2)  # cut on the left: 3 inputs predict 3, 4, 5
    with pytest.raises(ConfigError, match="does not fit max_length=1"):
        truncate_request([1], [2, 3], 1)


def test_continuation_scores_sum_log_softmax() -> None:
    logits = torch.tensor([[[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]]])  # (1, 2, 3)
    logp, greedy = continuation_scores(logits, torch.tensor([[2, 0]]))
    expected = (2 - math.log(1 + math.e + math.e**2)) + (3 - math.log(math.e**3 + 2))
    assert logp.item() == pytest.approx(expected) and greedy.item()
    assert not continuation_scores(logits, torch.tensor([[1, 0]]))[1].item()


def test_cut_at_stops_takes_the_earliest() -> None:
    assert cut_at_stops("abc.def\nghi", ["\n", "."]) == "abc"
    assert cut_at_stops("abc", ["", "x"]) == "abc"


def test_model_args_are_checked(runs: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="unknown rn"):
        PosencLM(rn=str(runs["alibi"]))
    with pytest.raises(ConfigError, match="give the run directory"):
        PosencLM()
    with pytest.raises(ConfigError, match="max_length must be an integer >= 1"):
        PosencLM(run=str(runs["alibi"]), device="cpu", max_length="0")
    lm = PosencLM(run=str(runs["alibi"]), device="cpu", batch_size="4")
    assert lm.max_length == 128 and lm.batch_size == 4  # the training length; lm-eval's batch size caps the rows
    with pytest.raises(ConfigError, match="decodes greedily"):
        lm.generate_until([Instance("generate_until", {}, ("x", {"do_sample": True, "temperature": 1.0}), 0)])


def test_posenc_lm_eval_command_line(runs: dict[str, Path], tasks: Path, tmp_path: Path) -> None:
    """`posenc-lm-eval` (here `python -m`, as the installed script calls the same `main`): lm-eval's own command
    line, which knows the model "posenc"."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "posenc_cli.cli.lm_eval_harness", "--model", "posenc"]
    command += ["--model_args", f"run={runs['alibi']},threads=1", "--tasks", "posenc_choice", "--device", "cpu"]
    command += ["--include_path", str(tasks), "--output_path", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_DATASETS_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    (written,) = out.rglob("results_*.json")
    results = json.loads(written.read_text())
    assert results["config"]["model"] == "posenc" and results["config"]["posenc_scheme"] == "alibi"
    assert 0.0 <= results["results"]["posenc_choice"]["acc,none"] <= 1.0
