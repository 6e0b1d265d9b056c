"""Shared helpers for the training/checkpoint tests: a tiny corpus and a tiny, fast config."""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from posenc_cli.config import Config, DataConfig, ModelConfig, TrainConfig
from posenc_cli.positional import config_class
from posenc_cli.run.config_load import config_from_dict

TEXT = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches near old "
    "river banks and bright stars fall into deep blue water under cold winter skies"
)
WORDS = TEXT.split()


def write_corpus(directory: Path, n_words: int = 4000, seed: int = 0) -> Path:
    """A deterministic word-salad text file (about 20 KB) with line breaks."""
    rng = np.random.default_rng(seed)
    words = [WORDS[i] for i in rng.integers(0, len(WORDS), n_words)]
    lines = [" ".join(words[i : i + 12]) for i in range(0, n_words, 12)]
    path = Path(directory) / "corpus.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def tiny_overrides(corpus: Path, **train: Any) -> list[str]:
    """Hydra-style overrides of the tiny config (for CLI/subprocess tests)."""
    t = {**TRAIN_DEFAULTS, **train}
    return [
        "model.d_model=32",
        "model.n_layer=2",
        "model.n_head=2",
        "pos=nope",
        "data=text",
        f"data.paths=[{corpus}]",
        "data.val_fraction=0.1",
        *(f"train.{k}={v}" for k, v in t.items()),
    ]


TRAIN_DEFAULTS: dict[str, Any] = {
    "seq_len": 16,
    "batch_size": 4,
    "steps": 20,
    "warmup_steps": 4,
    "precision": "fp32",
    "device": "cpu",
    "threads": 1,
    "log_every": 1,
    "eval_every": 10,
    "eval_batches": 2,
    "save_every": 5,
}


def tiny_config(corpus: Path, pos: str = "nope", model: dict[str, Any] | None = None, **train: Any) -> Config:
    """A 2-layer d=32 model on the tiny corpus; `train` overrides TrainConfig fields."""
    raw = {
        "model": {"d_model": 32, "n_layer": 2, "n_head": 2, **(model or {})},
        "pos": {"name": pos},
        "data": {"source": "text", "paths": [str(corpus)], "val_fraction": 0.1},
        "train": {**TRAIN_DEFAULTS, **train},
    }
    return config_from_dict(raw)


def train_scheme_runs(sweep_dir: Path, schemes: Sequence[str], data: DataConfig, **train: Any) -> None:
    """Train one tiny run (d=32, 2 layers, fp32 on one CPU thread) per scheme into `sweep_dir/<scheme>`.

    `train` sets TrainConfig fields; evaluation and the checkpoint come once, at the last step, unless given.
    """
    from posenc_cli.run.train import train as train_run

    fields = {"eval_every": train["steps"], "save_every": train["steps"], "eval_batches": 1, **train}
    for scheme in schemes:
        cfg = Config(
            model=ModelConfig(d_model=32, n_layer=2, n_head=2),
            pos=config_class(scheme)(name=scheme),
            data=copy.deepcopy(data),
            train=TrainConfig(precision="fp32", device="cpu", threads=1, **fields),
        )
        train_run(cfg, Path(sweep_dir) / scheme)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from posenc_cli.run.load import load_run

    return load_run(run_dir).model.state_dict()


def metrics(run_dir: Path, keys: tuple[str, ...] = ("step", "tokens", "train_loss", "val_loss", "lr")) -> list:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [tuple(json.loads(line)[k] for k in keys) for line in lines]


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@contextlib.contextmanager
def nan_loss_at(step: int) -> Iterator[None]:
    """Within the block, training's loss turns NaN at `step` (1-based), as a diverging run's does: that step's
    logits (training's one forward, `run.train._Trainer._forward`) are multiplied by NaN."""
    from posenc_cli.run import train as train_module

    forward = train_module._Trainer._forward

    def diverging(self: Any, batch: Any) -> torch.Tensor:
        logits = forward(self, batch)
        return logits * float("nan") if self.step + 1 == step else logits

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train_module._Trainer, "_forward", diverging)
        yield
