"""PoSE fine-tuning through `posenc extend --finetune-steps N --pose` (Zhu et al. 2023)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.config import ExtendConfig
from posenc_cli.errors import ConfigError
from posenc_cli.extension.extend import extend_run
from posenc_cli.extension.settings import default_out_dir
from posenc_cli.model import GPT
from posenc_cli.run.load import load_run
from posenc_cli.run.meta import read_meta
from posenc_cli.run.train import train

L = 16  # the parent's training length


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pose")
    out = root / "rope"
    train(tiny_config(write_corpus(root), pos="rope", steps=4), out)
    return out


def record_forwards(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[int, ...], torch.Tensor | None]]:
    """Every training forward's (token shape, position ids)."""
    seen: list[tuple[tuple[int, ...], torch.Tensor | None]] = []
    forward = GPT.forward

    def spy(self: GPT, idx: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if self.training:
            ids = kwargs.get("position_ids")
            seen.append((tuple(idx.shape), None if ids is None else ids.detach().cpu().clone()))
        return forward(self, idx, **kwargs)

    monkeypatch.setattr(GPT, "forward", spy)
    return seen


def test_pose_windows_are_L_tokens_with_ids_spanning_s_L(
    parent: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record_forwards(monkeypatch)
    ext = ExtendConfig(method="yarn", factor=4, finetune_steps=6, finetune_warmup=1, pose=True)
    res = extend_run(parent, tmp_path / "child", ext, threads=1)
    assert res.status == "finetuned" and len(seen) == 6
    for shape, ids in seen:
        assert shape[1] == L  # windows of the original length
        assert ids is not None and ids.shape == shape
        assert int(ids.min()) >= 0 and int(ids.max()) < 4 * L  # within [0, s·L)
        assert bool((ids.diff(dim=1) > 0).all())  # increasing within each chunk
        assert int((ids.diff(dim=1) > 1).sum(dim=1).max()) <= 1  # two chunks
    assert max(int(ids.max()) for _, ids in seen if ids is not None) >= 3 * L  # reaching toward s·L

    child = load_run(tmp_path / "child")  # recorded in the new run's config and meta
    tc = child.config.train
    assert (tc.seq_len, tc.pose_length, tc.pose_chunks, tc.random_positions) == (L, 4 * L, 2, 0)
    assert child.config.extend.pose is True
    assert child.config.pos.scaling.method == "yarn"  # type: ignore[attr-defined]
    assert child.config.pos.scaling.original_length == L  # type: ignore[attr-defined]
    ft = read_meta(tmp_path / "child")["extend"]["finetune"]
    assert (ft["seq_len"], ft["pose_length"], ft["pose_chunks"]) == (L, 4 * L, 2)
    assert child.meta.train_length == L and child.meta.base_length == L

    # deterministic for a seed: the same extension elsewhere draws the same ids and ends at the same weights
    first = list(seen)
    seen.clear()
    extend_run(parent, tmp_path / "again", ext, threads=1)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(first, seen, strict=True))  # type: ignore[arg-type]
    w1, w2 = child.model.state_dict(), load_run(tmp_path / "again").model.state_dict()
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_pose_with_an_explicit_target_and_evaluation_ids(
    parent: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record_forwards(monkeypatch)
    ext = ExtendConfig(method="linear", factor=2, finetune_steps=2, finetune_seq_len=48, pose=True, pose_chunks=3)
    extend_run(parent, tmp_path / "child", ext, threads=1)
    assert all(shape[1] == L and ids is not None and int(ids.max()) < 48 for shape, ids in seen)
    assert load_run(tmp_path / "child").config.train.pose_length == 48


def test_plain_finetune_passes_no_ids(parent: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = record_forwards(monkeypatch)
    extend_run(parent, tmp_path / "child", ExtendConfig(method="yarn", factor=2, finetune_steps=1), threads=1)
    assert [(shape[1], ids) for shape, ids in seen] == [(2 * L, None)]


def test_pose_needs_a_finetune_and_gets_its_own_directory(parent: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--finetune-steps"):
        extend_run(parent, tmp_path / "child", ExtendConfig(pose=True))
    assert not (tmp_path / "child").exists()
    ext = ExtendConfig(method="yarn", factor=4, finetune_steps=60, pose=True)
    assert default_out_dir(tmp_path / "rope", ext) == tmp_path / "rope-yarnx4-ft60-pose"


def test_cli_pose(parent: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    args = ["extend", str(parent), "--yarn", "--factor", "4", "--finetune-steps", "2", "--pose", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert f"PoSE: fine-tuned on {L}-token windows, position ids spanning {4 * L}" in result.output
    assert load_run(out).config.train.pose_length == 4 * L
    bad = CliRunner().invoke(app, ["extend", str(parent), "--pose", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--finetune-steps" in bad.output
