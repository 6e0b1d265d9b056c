"""Figures: files are written, and the lines drawn are the numbers in the results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.colors import to_hex

from posenc_cli.report import plots


def result(run: str, scheme: str, lengths: list[int], base: int = 16, na_from: int | None = None, **kw: Any) -> dict:
    entries = []
    for n in lengths:
        ok = na_from is None or n < na_from
        stride = kw.get("stride")
        scored = n if stride is None else min(stride, n)
        per_pos = list(np.linspace(3.0, 2.0, scored) + (0.01 * len(run))) if ok else []
        entries.append(
            {
                "protocol": "nonoverlap" if stride is None else "sliding",
                "stride": stride if stride is None else scored,
                "length": n,
                "multiple": n / base,
                "tokens": 256,
                "status": "ok" if ok else "n/a",
                "reason": None if ok else "too long",
                "ppl": float(np.exp(np.mean(per_pos))) if ok else None,
                "per_position": per_pos,
            }
        )
    return {"run": run, "scheme": scheme, "train_length": base, "base_length": base, "entries": entries}


LENGTHS = [8, 16, 32, 64]
RESULTS = [
    result("a", "rope", LENGTHS),
    result("b", "learned", LENGTHS, na_from=32),
    result("c", "rope", LENGTHS),
    result("d", "brand-new-scheme", LENGTHS),
]


def test_scheme_colours_fixed_and_stable() -> None:
    assert plots.scheme_colour("rope") == plots.SCHEME_COLOURS["rope"]
    assert plots.scheme_colour("brand-new-scheme") == plots.scheme_colour("brand-new-scheme")
    assert len(set(plots.SCHEME_COLOURS.values())) == len(plots.SCHEME_COLOURS)


def test_ppl_figure_lines_are_the_data() -> None:
    fig = plots.ppl_vs_length_figure(RESULTS)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "nonoverlap" in ax.get_title() and "trained at 16 tokens" in ax.get_title()
    assert ax.get_xlabel() and ax.get_ylabel()
    runs = [line for line in ax.get_lines() if not line.get_label().startswith("training")]
    assert len(runs) == 4
    for line, r in zip(runs, RESULTS, strict=True):
        ok = [e for e in r["entries"] if e["ppl"] is not None]
        np.testing.assert_array_equal(line.get_xdata(), [e["length"] for e in ok])
        np.testing.assert_allclose(line.get_ydata(), [e["ppl"] for e in ok])
        assert to_hex(line.get_color()) == plots.scheme_colour(r["scheme"]).lower()
    assert "n/a from 32" in runs[1].get_label()
    assert runs[0].get_marker() != runs[2].get_marker()  # same scheme, told apart by marker
    (train,) = [line for line in ax.get_lines() if line.get_label() == "training length"]
    assert list(train.get_xdata()) == [16, 16] and train.get_linestyle() == "--"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "a (rope)" in legend and "training length" in legend


def test_per_position_figure_data_and_sliding_offset() -> None:
    fig = plots.per_position_figure(RESULTS, smooth=0)
    ax = fig.axes[0]
    assert "L = 64" in ax.get_title()
    curves = [line for line in ax.get_lines() if line.get_label() and not line.get_label().startswith(("_", "train"))]
    assert len(curves) == 4
    a = curves[0]
    np.testing.assert_array_equal(a.get_xdata(), np.arange(64))
    np.testing.assert_allclose(a.get_ydata(), RESULTS[0]["entries"][-1]["per_position"])
    assert "only to L=16" in curves[1].get_label() and len(curves[1].get_xdata()) == 16

    sliding = [result("s", "alibi", [32, 64], stride=16)]
    ax = plots.per_position_figure(sliding, smooth=0).axes[0]
    line = next(ln for ln in ax.get_lines() if ln.get_label() == "s (alibi)")
    np.testing.assert_array_equal(line.get_xdata(), np.arange(48, 64))  # last 16 of 64 positions


def test_log_binned_mean() -> None:
    pos = np.arange(64)
    x, y = plots.log_binned_mean(pos, np.full(64, 2.5), per_octave=4)
    np.testing.assert_allclose(y, 2.5)
    x, y = plots.log_binned_mean(pos, pos.astype(float), per_octave=4)
    np.testing.assert_allclose(x, y)  # values equal to positions: bin means equal bin centres
    assert list(x[:3]) == [0.0, 1.0, 2.0]  # early positions keep their own bins
    widths = np.diff(x)
    assert widths[-1] > 4 * widths[1]  # bins widen with position
    # total weight is preserved: bin means weighted by counts give back the overall mean
    bins = np.floor(4 * np.log2(pos + 1)).astype(int)
    counts = np.bincount(np.unique(bins, return_inverse=True)[1])
    assert float(np.sum(y * counts) / 64) == pytest.approx(float(pos.mean()))
    _, y0 = plots.log_binned_mean(pos, pos * 2.0, per_octave=0)
    np.testing.assert_array_equal(y0, pos * 2.0)


def test_write_plots(tmp_path: Path) -> None:
    paths = plots.write_plots(RESULTS, tmp_path / "out" / "ppl.png")
    assert [p.name for p in paths] == ["ppl.png", "ppl_per_position.png"]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert sorted(x.name for x in (tmp_path / "out").iterdir()) == ["ppl.png", "ppl_per_position.png"]  # no temp


def test_runs_of_two_tokenizers_are_drawn_in_bits_per_byte() -> None:
    """Per-token perplexities of a BPE and a byte-level run on one axis compared different units."""
    bpe, byte = result("bpe", "rope", [16, 32]), result("byte", "rope", [16, 32])
    for r, fingerprint, bpb in ((bpe, "b1", 0.9), (byte, "b2", 4.0)):
        r["tokenizer"] = {"fingerprint": fingerprint, "name": fingerprint}
        for e in r["entries"]:
            e["bpb"] = bpb
    ax = plots.ppl_vs_length_figure([bpe, byte]).axes[0]
    assert ax.get_ylabel() == "bits per byte (log scale)" and ax.get_title().startswith("Bits per byte vs")
    runs = [line for line in ax.get_lines() if not line.get_label().startswith("training")]
    assert [list(line.get_ydata()) for line in runs] == [[0.9, 0.9], [4.0, 4.0]]
    one = plots.ppl_vs_length_figure([bpe]).axes[0]
    assert one.get_ylabel() == "perplexity (log scale)"
