"""check_budget: a training config that cannot run is refused from arithmetic alone, before any allocation; the
memory estimates it uses are lower bounds of what training really allocates."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from train_utils import tiny_config, write_corpus

from posenc_cli.errors import ConfigError
from posenc_cli.model import build_model
from posenc_cli.run.memory import micro_batch_bytes, step_seconds_at_least, validation_bytes
from posenc_cli.run.train import check_budget
from posenc_cli.run.validation import validation_batches

GIB = 2**30


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path)


@pytest.mark.parametrize(
    ("train", "names"),
    [
        ({"batch_size": 10**9}, "train.batch_size=1000000000 × train.seq_len=16 needs at least"),
        ({"eval_batches": 10**12}, "train.eval_batches=1000000000000 validation batches of 4 × 17 tokens"),
        ({"grad_accum": 10**12}, "train.grad_accum=1000000000000 micro-batches of 4 × 16 tokens"),
    ],
)
def test_impossible_budgets_are_refused_in_one_line(corpus: Path, train: dict, names: str) -> None:
    with pytest.raises(ConfigError, match=names) as refused:
        check_budget(tiny_config(corpus, **train), available=64 * GIB)
    assert "\n" not in str(refused.value) and "lower train." in str(refused.value)


def test_possible_budgets_pass(corpus: Path) -> None:
    check_budget(tiny_config(corpus), available=None)  # this machine, as train() checks it
    check_budget(tiny_config(corpus, grad_accum=10**6), available=GIB)  # huge but possible: SIGTERM stops it
    big = tiny_config(corpus, batch_size=4096, seq_len=256)  # about 4 GB of activations
    check_budget(big, available=8 * GIB)
    with pytest.raises(ConfigError, match="train.batch_size=4096"):
        check_budget(big, available=GIB)


def test_the_model_check_is_part_of_the_budget(corpus: Path) -> None:
    with pytest.raises(ConfigError, match="model.d_model=100000 model.n_layer=2"):
        check_budget(tiny_config(corpus, model={"d_model": 100_000}), available=64 * GIB)


def test_step_time_bound_grows_with_the_accumulation() -> None:
    assert step_seconds_at_least(10**4, 4, 16, 10) == pytest.approx(10 * 2e-5)  # overhead-bound micro-steps
    assert step_seconds_at_least(10**9, 64, 1024, 2) == pytest.approx(2 * 6 * 10**9 * 64 * 1024 / 1e15)


def test_micro_batch_estimate_is_below_what_backward_keeps(corpus: Path) -> None:
    """The activations autograd saves for one micro-batch (plus logits and their log-softmax) exceed the estimate."""
    cfg = tiny_config(corpus)
    model = build_model(cfg, 257)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randint(0, 257, (4, 16))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(x)  # (B, T, V)
        F.cross_entropy(logits.reshape(-1, 257), x.reshape(-1)).backward()
    kept = sum(n for ptr, n in saved.items() if ptr not in {p.untyped_storage().data_ptr() for p in model.parameters()})
    assert micro_batch_bytes(cfg.model, 257, 4, 16) <= kept + logits.numel() * 4


def test_validation_estimate_is_below_what_the_windows_allocate() -> None:
    val = np.arange(5000, dtype=np.uint16)
    tracemalloc.start()
    try:
        validation_batches(val, batch_size=8, seq_len=32, n_batches=50)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert validation_bytes(8, 32, 50) <= peak
