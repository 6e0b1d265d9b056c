"""`train.window_start`: uniform offsets as before, or windows that open at an end-of-document token (the NoPE
paper's one example per sequence), and the sweep identity of configs planned before the key existed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from corpus_utils import sample_batch

from posenc_cli.config import Config
from posenc_cli.data.cache import document_starts
from posenc_cli.errors import DataError
from posenc_cli.sweep.identity import job_identity

EOD = 256


def _stream() -> np.ndarray:
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    out: list[int] = []
    for d in docs:
        out += [*d, EOD]
    return np.asarray(out, dtype=np.int32)  # 1 2 3 E 4 5 E 6 7 8 9 E 10 E


def test_document_starts_are_the_eods_with_a_window_after_them() -> None:
    tokens = _stream()
    assert document_starts(tokens, EOD, 4).tolist() == [3, 6]  # offset 11 has only 2 tokens after it
    assert document_starts(tokens, EOD, 2).tolist() == [3, 6, 11]
    with pytest.raises(DataError, match="window_start=document"):
        document_starts(tokens, EOD, 13)


def test_document_windows_open_with_eod_and_uniform_draws_are_unchanged() -> None:
    tokens = _stream()
    starts = document_starts(tokens, EOD, 3)
    x, y = sample_batch(tokens, 64, 3, torch.Generator().manual_seed(0), starts)
    assert (x[:, 0] == EOD).all() and {tuple(r) for r in x[:, 1:].tolist()} <= {(4, 5), (6, 7), (10, EOD)}
    assert torch.equal(x[:, 1:], y[:, :-1])
    # the uniform path draws exactly what it drew before `starts` existed
    g = torch.Generator().manual_seed(1)
    offsets = torch.randint(0, len(tokens) - 3, (8,), generator=torch.Generator().manual_seed(1)).numpy()
    ux, _ = sample_batch(tokens, 8, 3, g)
    assert ux.tolist() == [tokens[o : o + 3].tolist() for o in offsets]


def test_config_and_identity() -> None:
    cfg = Config()
    assert cfg.train.window_start == "uniform"
    assert not any(k.startswith("train.window_start") for k in job_identity(cfg))  # as planned before the key
    assert "eval.longppl" not in job_identity(cfg)  # likewise: on by default, as sweeps planned before it measure
    cfg.train.window_start = "document"
    assert job_identity(cfg)["train.window_start"] == "document"


def test_train_with_document_windows(tmp_path) -> None:
    from typer.testing import CliRunner

    from posenc_cli.cli import app

    tiny = ["model=tiny", "model.d_model=32", "model.n_layer=1", "model.n_head=2", "train.seq_len=32"]
    data = ["data=algorithmic", "data.tasks=[copy]", "data.examples=100", "data.max_length=3"]
    out = tmp_path / "run"
    args = ["train", *tiny, *data, "train.window_start=document", "train.steps=2", "train.batch_size=2"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "window_start: document" in (out / "config.yaml").read_text()
    bad = CliRunner().invoke(app, ["train", *tiny, "train.window_start=docs", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "window_start" in bad.output and not (tmp_path / "x").exists()


def test_every_train_field_is_in_the_composed_train_group() -> None:
    """Hydra overrides only keys the composed group has: a TrainConfig field missing there cannot be set from the CLI
    (train.random_positions, pose_length and pose_chunks could not, before this test). The node is generated from
    TrainConfig (run/config_compose.py), so a new field is there without a YAML edit."""
    import dataclasses

    from posenc_cli.config import TrainConfig
    from posenc_cli.run.config_compose import compose_dict

    assert set(compose_dict(["train=quick"])["train"]) == {f.name for f in dataclasses.fields(TrainConfig)}
