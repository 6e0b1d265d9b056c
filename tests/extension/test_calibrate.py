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
from posenc_cli.extension.calibrate import calibrate_run, fit_windows, golden_section, mean_loss
from posenc_cli.extension.calibrate_settings import CalibrateSettings, c_grid, fit_lengths
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
    assert {-0.5, 0.0, 0.5, 1.0} <= set(losses) and len(losses) == 4 + 3
    assert result.c == min(losses, key=lambda c: (losses[c], abs(c), c))
    assert result.c_range == [-0.5, 1.0] and result.form == "cell"
    assert result.loss_before[4 * L] >= result.loss_after[4 * L]  # c = 0 (the parent) is a candidate
    child = load_run(out)
    m = child.config.model
    assert (m.attn_scale, m.temperature_c, m.logn_length, m.temperature_form) == ("drope", result.c, L, "cell")
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
        (CalibrateSettings("drope", ("4x",), step=0.0), r"--step must be in \[1e-06, 100\], got 0.0"),
        (CalibrateSettings("drope", ("4x",), c_min=1.0, c_max=1.0), "need 0 < step"),
        (CalibrateSettings("drope", ("4x",), form="token"), "per cell or per query"),  # type: ignore[arg-type]
        (CalibrateSettings("drope", ("4x",), c_min=-2.0, c_max=-1.0), "no c keeps β > 0"),
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
            at_zero = next(h["loss"] for h in result.history if h["c"] == 0.0)
            assert math.isclose(at_zero, mean_loss(parent.model, windows), rel_tol=1e-6)


def test_c_grid_holds_zero_both_signs_and_stops_where_beta_would_vanish() -> None:
    assert c_grid(0.1, -0.5, 0.3, 4.0) == [-0.5, -0.4, -0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.3]
    assert c_grid(0.25, -1.0, 0.5, 16.0) == [-0.25, 0.0, 0.25, 0.5]  # β(16) = 1 + c·ln 16 > 0 needs c > -0.361
    assert 0.0 in c_grid(0.3, -0.5, 1.0, 4.0)  # the parent is always a candidate


def test_a_negative_c_is_found_when_it_lowers_the_loss(parent: Path, tmp_path: Path, monkeypatch) -> None:
    """A stub loss lowest at c = -0.15 (as the data-dependent sweep's DroPE run was at 4x): the search returns c < 0,
    an interior minimum (not an edge), and the child holds it."""
    import posenc_cli.extension.calibrate as calibrate

    def stub_loss(model, windows, batch_tokens: int = 16384) -> float:
        t = model.blocks[0].attn.temperature
        c = 0.0 if t is None else t.c  # the parent (loss_before) has no temperature: c = 0
        return 2.66 + (c + 0.15) ** 2

    monkeypatch.setattr(calibrate, "mean_loss", stub_loss)
    settings = CalibrateSettings("drope", ("4x",), tokens=64, step=0.1, refine=8)
    result = calibrate_run(parent, settings, tmp_path / "neg")
    assert result.c is not None and -0.2 < result.c < -0.1 and abs(result.c + 0.15) < 0.01
    assert not result.at_edge and result.loss_after[4 * L] < result.loss_before[4 * L]
    assert load_run(tmp_path / "neg").config.model.temperature_c == result.c


def test_a_best_c_at_the_end_of_the_search_is_reported_as_that_edge(parent: Path, tmp_path: Path, monkeypatch) -> None:
    import posenc_cli.extension.calibrate as calibrate

    def falling(model, windows, batch_tokens: int = 16384) -> float:
        t = model.blocks[0].attn.temperature
        return 3.0 + (0.0 if t is None else t.c)  # lower and lower as c falls

    monkeypatch.setattr(calibrate, "mean_loss", falling)
    settings = CalibrateSettings("drope", ("4x",), tokens=64, step=0.1, c_min=-0.3, c_max=0.5, refine=2)
    result = calibrate_run(parent, settings, tmp_path / "edge")
    assert result.c == -0.3 and result.at_edge and result.c_range == [-0.3, 0.5]


def test_the_per_query_form_is_fitted_and_recorded_when_asked(parent: Path, tmp_path: Path) -> None:
    settings = CalibrateSettings("drope", ("4x",), tokens=128, step=0.5, c_max=1.0, refine=0, form="query")
    result = calibrate_run(parent, settings, tmp_path / "q")
    child = load_run(tmp_path / "q")
    assert child.config.model.temperature_form == "query" and result.form == "query"
    assert read_meta(tmp_path / "q")["extend"]["temperature"]["form"] == "query"
    windows, _ = fit_windows(child, 4 * L, 128, "train")
    assert math.isclose(mean_loss(child.model, windows), result.loss_after[4 * L], rel_tol=1e-6)
