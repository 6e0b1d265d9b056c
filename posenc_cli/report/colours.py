"""The accuracy colour scale every task table and heatmap shares: a cell's background and the text readable on it."""

from __future__ import annotations

# ColorBrewer RdYlGn's end points and middle, as (r, g, b): accuracy 0, 0.5 and 1.
_STOPS = ((215, 48, 39), (254, 224, 139), (26, 152, 80))


def accuracy_colour(accuracy: float) -> str:
    """Red (0) -> yellow (0.5) -> green (1), as a hex colour; clamped to [0, 1]."""
    t = min(max(accuracy, 0.0), 1.0) * 2
    k = min(int(t), 1)
    lo, hi = _STOPS[k], _STOPS[k + 1]
    return "#" + "".join(f"{round(a + (b - a) * (t - k)):02x}" for a, b in zip(lo, hi, strict=True))


def ink_colour(accuracy: float) -> str:
    """Text colour readable on `accuracy_colour(accuracy)`: white on the dark ends, black in the middle."""
    return "white" if accuracy < 0.2 or accuracy > 0.85 else "black"


def accuracy_style(accuracy: float) -> str:
    """The rich style of a cell showing `accuracy`: bold readable ink on its scale colour."""
    return f"bold {ink_colour(accuracy)} on {accuracy_colour(accuracy)}"
