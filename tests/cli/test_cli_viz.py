"""`posenc viz encoding|attention|compare` end to end on tiny trained runs, and its user errors (exit 2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.analysis import viz, viz_data
from posenc_cli.cli import app
from posenc_cli.run.load import load_run

runner = CliRunner()
TINY_MODEL = ["model.d_model=32", "model.n_layer=2", "model.n_head=2", "train.seq_len=16"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny runs (seq_len 16, 10 steps) on the test corpus; sweep-style names contain '='."""
    from posenc_cli.run.train import train

    root = tmp_path_factory.mktemp("viz-runs")
    corpus = write_corpus(root)
    out = {}
    for scheme in ("alibi", "learned"):
        out[scheme] = root / "sweep" / f"pos={scheme}"
        train(tiny_config(corpus, pos=scheme, steps=10, eval_every=10, save_every=10), out[scheme])
    return out


def invoke(*args: object) -> object:
    return runner.invoke(app, ["viz", *map(str, args)], terminal_width=160)


@pytest.mark.parametrize("scheme", ["nope", "sinusoidal", "learned", "rope", "alibi"])
def test_encoding_png_and_terminal_grid(scheme: str, tmp_path: Path) -> None:
    out = tmp_path / f"{scheme}.png"
    result = invoke("encoding", f"pos={scheme}", *TINY_MODEL, "--out", out)
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:4] == b"\x89PNG" and f"wrote {out}" in result.output
    if scheme == "nope":
        assert "no encoding to draw" in result.output
    else:
        assert "position" in result.output or "distance" in result.output
        rows = [line for line in result.output.splitlines() if line.strip()[:1].isdigit()]
        assert len(rows) >= 8  # the 8-row grid


def test_encoding_of_a_trained_run_and_errors(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "trained.png"
    result = invoke("encoding", runs["learned"], "--out", out)  # a path with '=' is still a run directory
    assert result.exit_code == 0, result.output
    assert out.is_file()
    assert invoke("encoding", "pos=nosuch", "--out", out).exit_code == 2
    assert invoke("encoding", "pos=learned", *TINY_MODEL, "--length", "64", "--out", out).exit_code == 2
    assert invoke("encoding", "pos=alibi", *TINY_MODEL, "--head", "7", "--out", out).exit_code == 2


def test_attention_png_rows_sum_to_one_and_side_by_side(runs: dict[str, Path], tmp_path: Path) -> None:
    result = invoke("attention", runs["alibi"], "--layer", "all", "--head", "all", "--windows", "2")
    assert result.exit_code == 0, result.output
    png = runs["alibi"] / "viz" / "attention.png"  # the default place
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "L = 16 (1×)" in result.output and "L = 64 (4×)" in result.output

    report = viz_data.attention_report(load_run(runs["alibi"]), layer="all", head="all", windows=2)
    assert [p.length for p in report.panels] == [16, 64] and [p.multiple for p in report.panels] == [1.0, 4.0]
    for panel in report.panels:
        assert panel.status == "ok" and len(panel.maps) == 2 * 2
        for m in panel.maps.values():
            np.testing.assert_allclose(np.nansum(m, axis=1), 1.0, rtol=1e-6)
        np.testing.assert_allclose(panel.mass.sum(-1), 1.0, rtol=1e-6)
    fig = viz.attention_figure(report)
    maps = [ax for ax in fig.axes if "training length)" in ax.get_title()]
    assert len(maps) == 2 * 4
    one, four = maps[0], maps[1]  # 1× and 4× of the same layer and head, side by side
    assert "L = 16 (1×" in one.get_title() and "L = 64 (4×" in four.get_title()
    assert one.get_position().y0 == pytest.approx(four.get_position().y0)
    assert four.get_position().x0 > one.get_position().x1


def test_attention_learned_beyond_table_says_na(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "learned.png"
    result = invoke("attention", runs["learned"], "--layer", "1", "--out", out)
    assert result.exit_code == 0, result.output
    assert out.is_file() and "n/a" in result.output
    report = viz_data.attention_report(load_run(runs["learned"]), layer="1")
    assert [p.status for p in report.panels] == ["ok", "n/a"]
    texts = [t.get_text() for ax in viz.attention_figure(report).axes for t in ax.texts]
    assert any(t.startswith("n/a") and "16 positions" in t for t in texts)


def test_attention_errors_exit_2(runs: dict[str, Path], tmp_path: Path) -> None:
    missing = invoke("attention", tmp_path / "nope")
    assert missing.exit_code == 2 and "does not exist" in missing.output
    bad_layer = invoke("attention", runs["alibi"], "--layer", "5", "--out", tmp_path / "x.png")
    assert bad_layer.exit_code == 2 and "0..1" in bad_layer.output
    assert invoke("attention", runs["alibi"], "--head", "x", "--out", tmp_path / "x.png").exit_code == 2
    assert invoke("compare", tmp_path / "nope").exit_code == 2


def test_compare_figure_one_panel_per_run(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "compare.png"
    sweep = runs["alibi"].parent
    result = invoke("compare", sweep, "--windows", "2", "--out", out)  # via write_attention_comparison
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:4] == b"\x89PNG"
    reports = [viz_data.attention_report(load_run(r), maps=False, windows=2) for r in sorted(runs.values())]
    fig = viz.compare_figure(reports)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 2 and all("trained at 16" in ax.get_title() for ax in panels)
    labels = [line.get_label() for line in panels[1].get_lines()]  # learned: 1× drawn, 4× n/a
    assert any("(4×): n/a" in label for label in labels) and any("(1×), mean distance" in label for label in labels)


def test_out_help_names_each_default() -> None:
    expected = {
        "encoding": "outputs/viz/encoding-<scheme>.png",
        "attention": "RUN_DIR/viz/attention.png",
        "compare": "outputs/viz/attention-compare.png",
    }
    for command, default in expected.items():
        result = runner.invoke(app, ["viz", command, "--help"], terminal_width=200)
        assert result.exit_code == 0 and f"(default: {default})" in result.output, command


# ----------------------------------------------------------------------------------------------------------------
# Per-layer layouts


@pytest.fixture(scope="module")
def hybrid_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pos=irope at 4 layers (3 chunked RoPE layers, 1 NoPE layer with the floor-log temperature), 10 steps."""
    from posenc_cli.run.train import train

    root = tmp_path_factory.mktemp("viz-hybrid")
    out = root / "sweep" / "pos=irope"
    train(tiny_config(write_corpus(root), pos="irope", model={"n_layer": 4}, steps=10, eval_every=10), out)
    return out


def test_encoding_of_a_layout_draws_each_scheme_under_its_layers(hybrid_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "irope.png"
    result = invoke("encoding", "pos=irope", *TINY_MODEL, "model.n_layer=4", "--out", out)
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:4] == b"\x89PNG"
    text = result.output
    assert "layers 0–2 of pos=irope: rope" in text and "layer 3 of pos=irope: nope" in text
    assert "layer 0: rope, chunked 4" in text and "layer 3: nope, floor-log temperature a=0.1, F=4" in text
    assert "rotation angle" in text
    only = invoke("encoding", hybrid_run, "--layer", "3", "--out", tmp_path / "nope.png")
    assert only.exit_code == 0, only.output
    assert "layer 3 of pos=irope: nope" in only.output and "of pos=irope: rope" not in only.output
    bad = invoke("encoding", hybrid_run, "--layer", "4", "--out", tmp_path / "x.png")
    assert bad.exit_code == 2 and "0..3" in bad.output


def test_attention_of_a_layout_run_honours_each_layers_span(hybrid_run: Path, tmp_path: Path) -> None:
    result = invoke("attention", hybrid_run, "--head", "0", "--windows", "2", "--out", tmp_path / "a.png")
    assert result.exit_code == 0, result.output
    assert "attends with" in result.output and "rope, chunked 4" in result.output
    report = viz_data.attention_report(load_run(hybrid_run), layer="all", head="0", windows=1)
    assert report.layer_notes == load_run(hybrid_run).model.scheme.describe_layers()
    for panel in report.panels:
        assert panel.status == "ok"
        assert np.all(panel.mass[:3, :, 4:] == 0)  # chunks of 4 tokens: no RoPE layer looks 4 or more back
        assert panel.mass[3, :, 4:].sum() > 0  # the global NoPE layer does
        T = panel.length
        i, j = np.indices((T, T))
        np.testing.assert_array_equal(~np.isnan(panel.maps[(0, 0)]), (j <= i) & (i // 4 == j // 4))
    titles = [ax.get_title() for ax in viz.attention_figure(report).axes]
    assert any("rope, chunked 4" in t for t in titles) and any("nope, floor-log" in t for t in titles)


def test_a_drope_panel_says_its_positions_were_dropped(tmp_path: Path) -> None:
    """A DroPE run's model attends without positions: its panel must not read as RoPE's."""
    from posenc_cli.run.train import train

    run = tmp_path / "drope-run"
    train(tiny_config(write_corpus(tmp_path), pos="rope", steps=10, eval_every=10, save_every=10, drope_at=5), run)
    report = viz_data.attention_report(load_run(run), maps=False, windows=1)
    fig = viz.compare_figure([report])
    assert "drope-run (rope), positions dropped at 5, trained at 16" in fig.axes[0].get_title()
