"""`posenc schemes`: lists every registered scheme, including ones added later."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import posenc_cli.positional as positional
from posenc_cli import api
from posenc_cli.cli import app
from posenc_cli.positional import PositionalScheme


def run() -> str:
    result = CliRunner().invoke(app, ["schemes"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_lists_the_core_schemes() -> None:
    out = run()
    for name in ("nope", "sinusoidal", "learned", "rope", "alibi"):
        assert name in out
    assert "arXiv:2108.12409" in out  # ALiBi's paper


def test_the_length_column_says_what_it_means() -> None:
    out = run()
    # "extrapolates: yes" read as a quality claim for RoPE and sinusoidal, which degrade beyond their length
    assert "reads longer inputs" in out and "extrapolates" not in out
    assert "says nothing about quality" in " ".join(out.split())


def test_rows_describe_hooks_parameters_and_extrapolation() -> None:
    rows = {r["name"]: r for r in api.schemes()}
    assert rows["learned"]["learned"] == "yes" and rows["learned"]["extrapolates"] == "no"
    assert rows["alibi"]["hooks"] == "bias" and rows["alibi"]["learned"] == "no"
    assert rows["rope"]["hooks"] == "rotate"
    assert rows["sinusoidal"]["hooks"] == "embed" and rows["sinusoidal"]["extrapolates"] == "yes"
    assert rows["nope"]["hooks"] == "none"


def test_new_schemes_appear_automatically(monkeypatch: pytest.MonkeyPatch) -> None:
    class Dummy(PositionalScheme):
        name = "dummy-scheme-xyz"
        hooks = ("bias",)
        paper = "Nobody 2099"

    positional.registry()  # load the real schemes first
    monkeypatch.setitem(positional._SCHEMES._entries, Dummy.name, Dummy)
    out = run()
    assert "dummy-scheme-xyz" in out and "Nobody 2099" in out


def test_layouts_show_their_layers_hooks() -> None:
    """A layout's row reads its layers (the class has no hooks of its own): irope rotates in its RoPE layers."""
    rows = {row["name"]: row for row in api.schemes()}
    assert rows["irope"]["hooks"] == "per layer (rope, nope): rotate"
    assert rows["gemma3"]["hooks"] == "per layer (rope): rotate" and rows["gemma3"]["learned"] == "no"
