"""The competence gate's words and looks: what a task table says of a run's in-distribution accuracy.

A beyond-L score means something only for a model that learned the task at lengths it was trained on (issue #38):
a run scoring below the threshold in distribution is "not learned", a run whose training data never held the task
is "not trained on this task" (that label takes precedence), and the two empty states every table already has stay
as they were: "cannot measure" (n/a: the scheme cannot read the length) and "not measured" (no cell). Each looks
different (`GATE_STYLE`); the numbers of a flagged row are still shown. `evaluation.competence` decides the state;
this module only names and styles it, so that the report layer and the CLI render it alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from rich.text import Text

__all__ = [
    "BEYOND_TRAINING",
    "CANNOT_MEASURE",
    "DEFAULT_COMPETENCE",
    "GATE_LEGEND",
    "GATE_STYLE",
    "LEARNED",
    "NOT_LEARNED",
    "NOT_MEASURED",
    "NOT_TRAINED",
    "GateStatus",
    "effective_cell",
    "gate_cell",
    "gate_legend",
    "gate_note",
    "gate_text",
    "is_flagged",
    "mark_panel",
    "state_cell",
]

DEFAULT_COMPETENCE = 0.9  # issue #38: a run below 90% in distribution has not learned the task

GateStatus = Literal[
    "learned",
    "not learned",
    "not trained on this task",
    "longer than its training examples",
    "cannot measure",
    "not measured",
]
LEARNED: GateStatus = "learned"
NOT_LEARNED: GateStatus = "not learned"
NOT_TRAINED: GateStatus = "not trained on this task"
BEYOND_TRAINING: GateStatus = "longer than its training examples"  # every ≤L cell's prompt is longer than them
CANNOT_MEASURE: GateStatus = "cannot measure"  # every in-distribution cell is n/a (the scheme cannot read it)
NOT_MEASURED: GateStatus = "not measured"  # no in-distribution cell stored

# rich styles: each state looks different from the others and from a plain score.
GATE_STYLE: dict[str, str] = {
    LEARNED: "green",
    NOT_LEARNED: "bold yellow",
    NOT_TRAINED: "italic magenta",
    BEYOND_TRAINING: "italic yellow",
    CANNOT_MEASURE: "dim",
    NOT_MEASURED: "dim italic",
}
# markdown and plain text: the marks of a flagged row
GATE_MARK: dict[str, str] = {
    LEARNED: "",
    NOT_LEARNED: "✗ not learned",
    NOT_TRAINED: "⊘ not trained on this task",
    BEYOND_TRAINING: "⇥ longer than its training examples",
    CANNOT_MEASURE: "n/a (cannot measure)",
    NOT_MEASURED: "– (not measured)",
}
GATE_LEGEND = (
    "≤L: accuracy in distribution (the lengths the run trained on); ✗ not learned: below the competence threshold "
    "there, so its beyond-L numbers measure a task never learned, not extrapolation; ⊘ not trained on this task: "
    "its training data never held the task; ⇥ longer than its training examples: the 1× prompts are longer than "
    "any example it trained on, so no cell is in distribution; n/a: the scheme cannot read those lengths; –: not "
    "measured"
)


def is_flagged(status: str) -> bool:
    """True for a row whose beyond-L numbers must not be read as extrapolation (anything but "learned")."""
    return status != LEARNED


def gate_text(status: str, accuracy: float | None) -> str:
    """The in-distribution cell as text: '97%' for a learned run, '43% ✗ not learned', '⊘ not trained on this task'
    and '⇥ longer than its training examples' (the accuracy, when measured, too), 'n/a (cannot measure)', '– (not
    measured)'."""
    if status in (NOT_TRAINED, BEYOND_TRAINING):
        return GATE_MARK[status] if accuracy is None else f"{accuracy:.0%} {GATE_MARK[status]}"
    if accuracy is None:
        return GATE_MARK.get(status, status)
    mark = GATE_MARK.get(status, "")
    return f"{accuracy:.0%}" + (f" {mark}" if mark else "")


def gate_note(threshold: float) -> str:
    """The caption line that says what the gate is."""
    return (
        f"Competence gate: a run scoring below {threshold:.0%} at the lengths it trained on (≤L, --competence) is "
        "marked ✗ not learned; a run never trained on the task ⊘ not trained on this task; their beyond-L numbers "
        "are shown but measure no learned skill."
    )


def gate_cell(status: str, accuracy: float | None) -> Text:
    """The in-distribution cell of a rich table, styled by state (`GATE_STYLE`)."""
    return Text(gate_text(status, accuracy), style=GATE_STYLE.get(status, ""))


def effective_cell(label: str, status: str) -> Text | str:
    """RULER's effective length as a cell: as is for a learned run, else the gate's mark first (an effective length
    of a task never learned says nothing of extrapolation), the length kept in brackets."""
    if not is_flagged(status) or status in (CANNOT_MEASURE, NOT_MEASURED):
        return label
    return Text(f"{GATE_MARK[status]} ({label})", style=GATE_STYLE[status])


# a heatmap panel of a flagged run is hatched over
GATE_HATCH = {NOT_LEARNED: "//", NOT_TRAINED: "xx", BEYOND_TRAINING: ".."}


def mark_panel(ax: Any, status: str) -> None:
    """Hatch a flagged run's heatmap panel over (its numbers stay readable) and say its state in the title."""
    # deferred: keeps matplotlib off posenc --help start-up
    from matplotlib.patches import Rectangle

    if status not in GATE_HATCH:
        return
    ax.add_patch(
        Rectangle(
            (0, 0),
            1,
            1,
            transform=ax.transAxes,
            fill=False,
            hatch=GATE_HATCH[status],
            edgecolor="0.35",
            linewidth=0,
            label=GATE_MARK[status],
            zorder=3,
        )
    )
    ax.set_title(f"{ax.get_title()}\n{GATE_MARK[status]}", fontsize=9)


def gate_legend(fig: Any, statuses: Iterable[str], threshold: float) -> None:
    """A figure legend entry per flagged state shown (none when every panel learned its task)."""
    # deferred: keeps matplotlib off posenc --help start-up
    from matplotlib.patches import Patch

    shown = [s for s in (NOT_LEARNED, NOT_TRAINED, BEYOND_TRAINING) if s in set(statuses)]
    words = {
        NOT_LEARNED: f"{GATE_MARK[NOT_LEARNED]} (≤L below {threshold:.0%})",
        NOT_TRAINED: GATE_MARK[NOT_TRAINED],
        BEYOND_TRAINING: GATE_MARK[BEYOND_TRAINING],
    }
    handles = [Patch(facecolor="white", edgecolor="0.35", hatch=GATE_HATCH[s], label=words[s]) for s in shown]
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8)


def state_cell(status: str) -> Text:
    """The gate's verdict alone as a cell ('✓ learned', '✗ not learned', ...), styled by state."""
    return Text(GATE_MARK.get(status) or f"✓ {status}", style=GATE_STYLE.get(status, ""))
