"""train(): schedule, parameter groups, run directory contents, guards, completion and config checks."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch
from train_utils import metrics, nan_loss_at, tiny_config, weights, write_corpus

from posenc_cli.config import TrainConfig
from posenc_cli.errors import CheckpointError, ConfigError, DataError
from posenc_cli.model import build_model
from posenc_cli.run.load import load_run
from posenc_cli.run.meta import read_meta
from posenc_cli.run.optim import lr_at, param_groups
from posenc_cli.run.train import TrainingDiverged, train


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path)


# -- pure pieces -------------------------------------------------------------------------------------------------


def test_lr_schedule_warmup_then_cosine_to_floor() -> None:
    cfg = TrainConfig(lr=1e-3, min_lr_ratio=0.1, warmup_steps=10, steps=110)
    lrs = [lr_at(s, cfg) for s in range(cfg.steps)]
    assert lrs[:10] == pytest.approx([1e-3 * (s + 1) / 10 for s in range(10)])  # linear warm-up
    assert lrs[10] == pytest.approx(1e-3)  # peak right after warm-up
    # halfway through the decay the cosine is at the midpoint between peak and floor
    assert lrs[60] == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4))
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))
    assert lr_at(cfg.steps, cfg) == pytest.approx(1e-4)  # floor = lr·min_lr_ratio
    assert min(lrs) > 0


def test_lr_schedule_without_warmup() -> None:
    cfg = TrainConfig(lr=2e-3, min_lr_ratio=0.0, warmup_steps=0, steps=4)
    assert [lr_at(s, cfg) for s in range(4)] == pytest.approx(
        [2e-3 * 0.5 * (1 + math.cos(math.pi * s / 4)) for s in range(4)]
    )


def test_param_groups_no_decay_on_norms_biases_embeddings_and_positions(corpus: Path) -> None:
    cfg = tiny_config(corpus, pos="learned")
    model = build_model(cfg, vocab_size=257)
    decay, keep = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and keep["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in keep["params"]}
    assert not decayed & kept
    assert decayed | kept == set(names.values())  # every parameter exactly once (tied weight counted once)
    assert "wte.weight" in kept  # tied token embedding / output head
    assert any(n.startswith("scheme.") for n in kept)  # learned position table
    assert not any(n.startswith("scheme.") for n in decayed)
    assert all(p.ndim == 2 for p in decay["params"])
    assert any(n.endswith("attn.proj.weight") for n in decayed) and any(n.endswith("mlp.fc.weight") for n in decayed)
    assert all(not n.endswith(".bias") and "norm" not in n for n in decayed)


def test_weight_decay_is_decoupled_and_skips_no_decay_params(corpus: Path) -> None:
    """With zero gradients Adam's step is 0, so only the decoupled decay p <- p·(1 − lr·wd) moves weights."""
    from posenc_cli.run.optim import build_optimizer

    cfg = tiny_config(corpus, lr=0.01, weight_decay=0.5)
    model = build_model(cfg, vocab_size=257)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, cfg.train, torch.device("cpu"))
    assert all(group["fused"] for group in opt.param_groups)  # the kernel training uses
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        decayed = p.ndim == 2 and not n.startswith(("wte", "scheme"))
        expected = before[n] * (1 - 0.01 * 0.5) if decayed else before[n]
        torch.testing.assert_close(p.detach(), expected, rtol=0, atol=1e-7, msg=n)


# -- a full run --------------------------------------------------------------------------------------------------


def test_fresh_run_writes_a_complete_run_directory(corpus: Path, tmp_path: Path) -> None:
    events: list[dict] = []
    cfg = tiny_config(corpus, steps=20)
    result = train(cfg, tmp_path / "run", callback=events.append)
    run = tmp_path / "run"
    assert result.stopped_reason == "complete" and result.step == 20
    assert {p.name for p in run.iterdir()} >= {
        "model.safetensors",
        "state.safetensors",
        "state.json",
        "config.yaml",
        "meta.json",
        "metrics.jsonl",
    }
    assert not (run / ".pending").exists()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["kind"] == "posenc-run" and meta["schema_version"] == 1 and meta["status"] == "complete"
    assert meta["step"] == 20 and meta["tokens"] == 20 * 4 * 16
    assert meta["train_length"] == meta["base_length"] == 16 and meta["parent"] is None
    assert meta["precision"] == "fp32" and meta["seed"] == 0
    assert set(meta["versions"]) >= {"posenc", "torch", "python"}
    assert meta["data"]["fingerprint"] and set(meta["files"]) >= {"model.safetensors", "state.safetensors"}
    assert meta["best_val_loss"] == pytest.approx(min(v for *_, v, _ in metrics(run) if v is not None))
    rows = metrics(run)
    assert [r[0] for r in rows] == list(range(1, 21))  # log_every=1: one line per step, none twice
    assert [r[0] for r in rows if r[3] is not None] == [10, 20]  # validation every eval_every steps
    assert rows[-1][2] < rows[0][2]  # it learns
    kinds = [e["event"] for e in events]
    assert kinds[0] == "data" and "start" in kinds and kinds[-1] == "end"
    assert sum(k == "step" for k in kinds) == 20
    loaded = load_run(run)
    assert loaded.meta.step == 20 and loaded.config == cfg
    assert result.val_loss == pytest.approx(meta["val_loss"]) and result.val_ppl == pytest.approx(
        math.exp(meta["val_loss"])
    )


def test_finished_run_is_not_retrained(corpus: Path, tmp_path: Path) -> None:
    cfg = tiny_config(corpus, steps=6)
    train(cfg, tmp_path / "run")
    before = (tmp_path / "run" / "meta.json").read_bytes()
    again = train(cfg, tmp_path / "run")
    assert again.stopped_reason == "already_complete" and again.step == 6
    assert (tmp_path / "run" / "meta.json").read_bytes() == before


def test_different_config_is_refused_unless_forced(corpus: Path, tmp_path: Path) -> None:
    train(tiny_config(corpus, steps=6), tmp_path / "run")
    with pytest.raises(ConfigError, match=r"different config \(train\.lr: 0\.003 -> 0\.001\).*--force-config"):
        train(tiny_config(corpus, steps=6, lr=1e-3), tmp_path / "run")
    longer = train(tiny_config(corpus, steps=9), tmp_path / "run", force_config=True)
    assert longer.stopped_reason == "complete" and longer.step == 9
    assert read_meta(tmp_path / "run")["steps"] == 9
    assert [r[0] for r in metrics(tmp_path / "run")] == list(range(1, 10))


def test_resume_flag_needs_a_run(corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="is not a posenc run directory"):
        train(tiny_config(corpus), tmp_path / "nothing", resume=True)


def test_foreign_directory_is_not_overwritten(corpus: Path, tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "model.safetensors").write_bytes(b"someone else's")
    with pytest.raises(CheckpointError, match="not a posenc run directory"):
        train(tiny_config(corpus), tmp_path / "run")
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == b"someone else's"


def test_a_run_refused_after_claiming_its_directory_leaves_nothing_it_created(tmp_path: Path) -> None:
    """The corpus is missing: found only after the run directory (and its parents) were claimed and locked."""
    cfg = tiny_config(tmp_path / "no-such-corpus.txt")
    with pytest.raises(DataError, match="not found"):
        train(cfg, tmp_path / "a" / "b" / "run")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="train.batch_size"):  # refused before anything is created
        train(tiny_config(tmp_path / "no-such-corpus.txt", batch_size=10**9), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_refused_run_keeps_what_was_there_before(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text("")  # leftovers of an earlier posenc process
    (run / "failed.json").write_text("{}")
    with pytest.raises(DataError):
        train(tiny_config(tmp_path / "no-such-corpus.txt"), run)
    assert sorted(p.name for p in run.iterdir()) == [".lock", "failed.json"]
    assert (run / "failed.json").read_text() == "{}"


def test_nan_loss_stops_before_the_update_and_keeps_the_last_checkpoint(corpus: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    with (
        nan_loss_at(8),
        pytest.raises(TrainingDiverged, match=r"non-finite loss \(nan\) at step 8.*checkpoint \(step 5\)") as info,
    ):
        train(tiny_config(corpus, steps=20, save_every=5), run)
    assert info.value.step == 8 and info.value.last_good == 5
    loaded = load_run(run, complete_only=False)  # the step-5 checkpoint is intact and finite
    assert loaded.meta.step == 5 and loaded.meta.status == "running"
    assert all(torch.isfinite(t).all() for t in loaded.model.state_dict().values())
    assert max(r[0] for r in metrics(run)) == 7  # step 8 never happened
    done = train(tiny_config(corpus, steps=20, save_every=5), run)  # resumable from the good checkpoint
    assert done.step == 20 and [r[0] for r in metrics(run)] == list(range(1, 21))


def test_init_from_starts_from_parent_weights(corpus: Path, tmp_path: Path) -> None:
    train(tiny_config(corpus, steps=6), tmp_path / "parent")
    parent = weights(tmp_path / "parent")
    child_cfg = tiny_config(corpus, steps=0)
    result = train(child_cfg, tmp_path / "child", init_from=tmp_path / "parent", meta_extra={"base_length": 99})
    assert result.step == 0 and result.val_loss is not None
    child = weights(tmp_path / "child")
    assert all(torch.equal(parent[k], child[k]) for k in parent)
    meta = read_meta(tmp_path / "child")
    assert meta["parent"] == str(tmp_path / "parent") and meta["base_length"] == 99 and meta["train_length"] == 16


def test_bpe_run_keeps_its_tokenizer(corpus: Path, tmp_path: Path) -> None:
    from posenc_cli.config import replace

    cfg = tiny_config(corpus, steps=3)
    cfg = replace(cfg, tokenizer=replace(cfg.tokenizer, kind="bpe", vocab_size=300))
    train(cfg, tmp_path / "run")
    assert "tokenizer.json" in read_meta(tmp_path / "run")["files"]
    loaded = load_run(tmp_path / "run")
    assert loaded.tokenizer.kind == "bpe"
    assert loaded.tokenizer.fingerprint == loaded.meta.record["tokenizer"]["fingerprint"]
