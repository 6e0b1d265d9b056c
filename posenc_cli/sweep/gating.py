"""Which jobs a gated stage runs (`learned_only: true` / `not_learned_only: true`, issues #44 and #38): the verdict
of the competence gate on the runs it follows, read from their directories.

A gated stage follows each group's pick of its select stage, or with `gate_by: <stage>` each job's own run of that
earlier train stage (a seed's run at twice the steps follows that seed's run, not seed 0's). The verdict is the
gate's own (`evaluation.competence.assess_run` at the sweep's threshold), not the pick's metric against the
threshold: "tasks", a RULER-style mixture, is learned only when every task is, so a mean of 93% with one needle at
80% is "not learned" (what the task tables say of it). A sweep given its own metric reader
(`run_sweep(read_metric=...)`) judges by that value against the threshold instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from posenc_cli.report.gate import LEARNED, NOT_LEARNED
from posenc_cli.sweep.markers import job_status
from posenc_cli.sweep.select import GridJob, Pick, Reader
from posenc_cli.sweep.spec import SelectSpec, StageSpec

__all__ = ["RunGate", "gate_reader", "read_gates"]


@dataclass(frozen=True)
class RunGate:
    """The gate's verdict on one run: its in-distribution accuracy (None: no score) and whether it `learned`;
    `status`: the gate's state when it is neither "learned" nor "not learned" ("not measured", ...)."""

    accuracy: float | None
    learned: bool
    status: str = ""

    @classmethod
    def of_value(cls, value: float | None, gate: float) -> RunGate:
        """A metric's value against the gate (None or NaN: no score, not learned)."""
        if value is None or math.isnan(value):
            return cls(None, False)
        return cls(value, value >= gate)

    def text(self, gate: float) -> str:
        """'not learned (60% < the gate, 90%)', 'learned (95% >= the gate, 90%)', 'not learned (no score)', 'not
        learned (93% on average, a task below the gate, 90%)'."""
        if self.accuracy is None or math.isnan(self.accuracy):
            return f"not learned ({self.status or 'no score'})"
        if self.learned:
            return f"learned ({self.accuracy:.0%} >= the gate, {gate:.0%})"
        if self.status:
            return f"not learned ({self.accuracy:.0%}, {self.status})"
        if self.accuracy >= gate:
            return f"not learned ({self.accuracy:.0%} on average, a task below the gate, {gate:.0%})"
        return f"not learned ({self.accuracy:.0%} < the gate, {gate:.0%})"


GateReader = Callable[[Path], RunGate]


class StageJobs(Protocol):
    """What the verdicts need of a planned stage (`sweep.plan.StagePlan`, which imports this module)."""

    stage: StageSpec
    awaiting: str | None

    @property
    def jobs(self) -> Sequence[GridJob]: ...


def gate_reader(rule: SelectSpec, gate: float, read: Reader | None = None) -> GateReader:
    """The verdict on a run's directory for a gated stage after a select stage of `rule`: the gate's own on
    `rule.task` at threshold `gate`, or, given `read` (a metric reader), that value against `gate`."""
    if read is not None:
        return lambda job_dir: RunGate.of_value(read(job_dir), gate)
    from posenc_cli.evaluation.competence import assess_run  # deferred: the task registries

    task, scoring = str(rule.task), rule.scoring

    def verdict(job_dir: Path) -> RunGate:
        if job_status(job_dir) != "done":
            return RunGate(None, False, "did not finish")
        found = assess_run(job_dir, task, gate, scoring)
        status = "" if found.status in (LEARNED, NOT_LEARNED) else found.status
        return RunGate(found.accuracy, found.learned, status)

    return verdict


def read_gates(
    plans: Sequence[StageJobs],
    picks: Mapping[str, Pick],
    sweep_dir: Path,
    gate: float,
    read: Reader | None = None,
) -> dict[str, RunGate]:
    """The verdict, by run (`Job.key`), on every run a gated stage of `plans` follows that can be judged now: the
    picked run of each group of its select stage (where `picks` holds the pick) and, for a stage with `gate_by`, each
    job of that stage that finished or failed (a job still to run has none, so the stage awaits it)."""
    by_name = {plan.stage.name: plan for plan in plans}
    out: dict[str, RunGate] = {}
    for plan in plans:
        st = plan.stage
        if st.runs_for is None or st.after is None or st.after not in picks:
            continue
        rule = by_name[st.after].stage.select
        assert rule is not None
        judge = gate_reader(rule, gate, read)
        runs = [point.run for point in picks[st.after].chosen_points.values()]
        source = by_name.get(st.gate_by) if st.gate_by else None
        if source is not None and not source.awaiting:
            runs = [job.key for job in source.jobs if job_status(job.dir(sweep_dir)) in ("done", "failed")]
        for run in runs:
            if run not in out:
                out[run] = judge(Path(sweep_dir) / run)
    return out
