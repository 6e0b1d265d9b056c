"""`extension.calibrate`: DroPE's c by grid + golden section and NoPE HeadScale on a frozen model, each written as a
child run that evaluation applies; the parent untouched, re-runs reused, bad requests refused before writing."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest
import torch
from train_utils import tiny_config, write_corpus

from posenc_cli.errors import ConfigError
from posenc_cli.extension.calibrate import (
    CalibrateSettings,
    calibrate_run,
    fit_lengths,
    fit_windows,
    golden_section,
    mean_loss,
)
from posenc_cli.run.load import load_run
from posenc_cli.run.meta import read_meta
from posenc_cli.run.train import train

L = 16
DROPE = CalibrateSettings("drope", ("4x",), tokens=192, step=0.5, c_max=1.0, refine=3)
HEAD = CalibrateSettings("head-scale", ("2x",), tokens=128, steps=6, lr=0.1, batch_size=2)


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("calibrate")
    train(tiny_config(write_corpus(root), pos="nope", steps=8), root / "nope")
    return root / "nope"


def digest(run: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run.iterdir()) if p.is_file()}


def test_fit_lengths() -> None:
    assert fit_lengths(["4x", "2.5x", "100", 64, "4x"], 16) == (64, 40, 100)
    with pytest.raises(ConfigError, match="multiple of the training length"):
        fit_lengths(["four"], 16)


def test_golden_section_narrows_onto_the_minimum() -> None:
    seen: dict[float, float] = {}

    def f(x: float) -> float:
        return seen.setdefault(x, (x - 0.3137) ** 2)

    golden_section(f, 0.2, 0.4, 14)
    assert len(seen) == 14 and abs(min(seen, key=seen.__getitem__) - 0.3137) < 1e-3
    assert all(round(x, 4) == x for x in seen)  # every scored point is a recordable value
    for n in (0, 1, 2, 5):
        seen.clear()
        golden_section(f, 0.2, 0.4, n)
        assert len(seen) == n  # exactly the scores asked for


def test_drope_child_holds_the_fitted_c_and_the_parent_weights(parent: Path, tmp_path: Path) -> None:
    before = digest(parent)
    out = tmp_path / "drope"
    result = calibrate_run(parent, DROPE, out)
    assert result.status == "created" and result.lengths == [4 * L]
    losses = {h["c"]: h["loss"] for h in result.history}
    assert {0.0, 0.5, 1.0} <= set(losses) and len(losses) == 3 + 3
    assert result.c == min(losses, key=lambda c: (losses[c], c))
    assert result.loss_before[4 * L] >= result.loss_after[4 * L]  # c = 0 (the parent) is a candidate
    child = load_run(out)
    m = child.config.model
    assert (m.attn_scale, m.temperature_c, m.logn_length) == ("drope", result.c, L)
    meta, parent_meta = read_meta(out), read_meta(parent)
    assert meta["parent"] == str(parent.resolve()) and meta["extend"]["method"] == "calibrate"
    assert meta["extend"]["fit"]["lengths"] == [4 * L] and meta["extend"]["fit"]["split"] == "train"
    assert meta["files"]["model.safetensors"] == parent_meta["files"]["model.safetensors"]  # byte for byte
    windows, _ = fit_windows(child, 4 * L, 192, "train")
    assert math.isclose(mean_loss(child.model, windows), result.loss_after[4 * L], rel_tol=1e-6)  # what eval sees
    assert digest(parent) == before  # the parent never written
    again = calibrate_run(parent, DROPE, out)
    assert again.status == "already_complete" and again.c == result.c and again.history == result.history
    with pytest.raises(ConfigError, match="different extension"):
        calibrate_run(parent, CalibrateSettings("drope", ("4x",), tokens=192, step=0.25, c_max=1.0), out)


def test_head_scale_child_trains_only_the_scales(parent: Path, tmp_path: Path) -> None:
    out = tmp_path / "hs"
    result = calibrate_run(parent, HEAD, out)
    child, plain = load_run(out), load_run(parent)
    assert child.config.model.attn_scale == "head-scale" and len(result.history) == 6
    state, parent_state = child.model.state_dict(), plain.model.state_dict()
    assert set(state) - set(parent_state) == {"blocks.0.attn.head_scale", "blocks.1.attn.head_scale"}
    assert all(torch.equal(state[k], v) for k, v in parent_state.items())  # the rest frozen
    scales = torch.stack([state[f"blocks.{i}.attn.head_scale"] for i in range(2)])
    assert not torch.equal(scales, torch.ones(2, 2))
    torch.testing.assert_close(scales, torch.tensor(result.head_scale), rtol=0, atol=1e-6)
    windows, _ = fit_windows(child, 2 * L, 128, "train")
    assert math.isclose(mean_loss(child.model, windows), result.loss_after[2 * L], rel_tol=1e-6)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (CalibrateSettings("drope", ("1x",)), "must exceed the training length"),
        (CalibrateSettings("drope", ("4x",), step=0.0), "need 0 < step"),
        (CalibrateSettings("head-scale", ("2x", "4x")), "one length"),
        (CalibrateSettings("logn", ("2x",)), "calibrate fits drope or head-scale"),  # type: ignore[arg-type]
        (CalibrateSettings("drope", ("2x",), split="test"), "train or val split"),  # type: ignore[arg-type]
    ],
)
def test_bad_requests_are_refused_before_writing(parent: Path, tmp_path: Path, settings, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        calibrate_run(parent, settings, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_child_is_not_calibrated_again_and_the_parent_is_not_the_out(parent: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="extend never modifies its source"):
        calibrate_run(parent, DROPE, parent)
    calibrate_run(parent, DROPE, tmp_path / "c")
    with pytest.raises(ConfigError, match="already has a temperature"):
        calibrate_run(tmp_path / "c", DROPE, tmp_path / "cc")


def test_a_drope_run_is_fitted_and_written_without_its_positions(tmp_path: Path) -> None:
    """A run that dropped RoPE (train.drope_at): the fits score, and the children hold, the model without positions."""
    train(tiny_config(write_corpus(tmp_path), pos="rope", steps=6, drope_at=4), tmp_path / "drope")
    parent = load_run(tmp_path / "drope")
    assert parent.positions_dropped_at == 4
    for settings, name in ((DROPE, "c"), (HEAD, "hs")):
        result = calibrate_run(tmp_path / "drope", settings, tmp_path / name)
        child = load_run(tmp_path / name)
        assert child.positions_dropped_at == 4 and child.config.model.attn_scale == settings.temperature
        (n,) = result.lengths
        windows, _ = fit_windows(child, n, settings.tokens, "train")
        assert math.isclose(mean_loss(child.model, windows), result.loss_after[n], rel_tol=1e-6)
        if name == "c":  # c = 0 is the parent itself: the recorded loss there is the dropped model's
            assert math.isclose(result.history[0]["loss"], mean_loss(parent.model, windows), rel_tol=1e-6)
