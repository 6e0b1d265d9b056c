"""colours: the accuracy scale's stops, its clamping, and ink that stays readable on every background."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from posenc_cli.report.colours import accuracy_colour, accuracy_style, ink_colour


@pytest.mark.parametrize(("accuracy", "colour"), [(0.0, "#d73027"), (0.5, "#fee08b"), (1.0, "#1a9850")])
def test_colour_scale_hits_the_colorbrewer_stops(accuracy: float, colour: str) -> None:
    assert accuracy_colour(accuracy) == colour


def test_colour_scale_is_clamped_and_interpolates_between_stops() -> None:
    assert accuracy_colour(-1.0) == "#d73027" and accuracy_colour(2.0) == "#1a9850"
    assert accuracy_colour(0.25) == "#ea8859"  # halfway from (215, 48, 39) to (254, 224, 139), rounded half to even


def _luminance(hex_colour: str) -> float:
    r, g, b = (int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


@given(st.floats(min_value=0.0, max_value=1.0))
def test_ink_contrasts_with_its_background(accuracy: float) -> None:
    background = _luminance(accuracy_colour(accuracy))
    ink = ink_colour(accuracy)
    assert ink in {"white", "black"}
    assert (background < 0.75) if ink == "white" else (background > 0.3)
    assert accuracy_style(accuracy) == f"bold {ink} on {accuracy_colour(accuracy)}"
