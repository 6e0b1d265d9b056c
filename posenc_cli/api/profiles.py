"""Reading a sweep's profile (`profile.json`, `SweepReport.profile`): where the time went, as table rows."""

from __future__ import annotations

from typing import Any

__all__ = ["profile_rows"]


def profile_rows(profile: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per phase of a sweep's profile (`perf.profiling.summary_rows`): phase, seconds summed over the jobs,
    share, GFLOP, GFLOP/s and efficiency (of the same dtype's matmul peak; None when not measured); the jobs' phases
    first in a fixed order, then the sweep's own (start-up, plan, report)."""
    # deferred: the profiling module reads torch's device facts
    from posenc_cli.perf.profiling import summary_rows

    return summary_rows(profile)
