"""Markdown tables of a cost curve (`posenc bench --eval-lengths ... --json curve.json`), for the docs.

    python benchmarks/cost_curve_md.py curve.json

Prints the machine line, then µs per token and peak MiB per scheme and length (– not measured, n/a cannot measure,
failed), the longest length within the memory limit, and each scheme's reason for stopping.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MARKS = {"not measured": "–", "cannot measure": "n/a", "failed": "failed"}


def table(result: dict[str, Any], key: str, spec: str) -> list[str]:
    lengths = result["lengths"]
    limit = result["memory_limit_applied_gib"]
    cells: dict[str, dict[int, str]] = {}
    for r in result["rows"]:
        cells.setdefault(r["scheme"], {})[r["length"]] = (
            spec.format(r[key]) if r["status"] == "measured" else MARKS[r["status"]]
        )
    head = ["scheme", *(f"{n:,}" for n in lengths), f"longest within {limit:g} GiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for scheme in result["schemes"]:
        lines.append(
            "| " + " | ".join([scheme, *(cells[scheme][n] for n in lengths), reach_text(result, scheme)]) + " |"
        )
    return lines


def reach_text(result: dict[str, Any], scheme: str) -> str:
    """'≥ 65,536 (all asked)', '≥ 8,192 (time budget)': a lower bound; '16,384 (memory)': the limit stopped it."""
    entry = result["reach"][scheme]
    why = {None: "all asked", "time": "time budget", "memory": "memory", "cannot": "n/a beyond", "failed": "failed"}
    if entry["longest"] is None:
        return "none"
    bound = "≥ " if entry["stop"] in (None, "time") else ""
    return f"{bound}{entry['longest']:,} ({why[entry['stop']]})"


def main(path: str) -> None:
    result = json.loads(Path(path).read_text())
    c = result["config"]
    print(
        f"{result['device']}, {result.get('threads')} thread(s), {result['precision']} "
        f"(train.precision={result['precision_setting']}), torch {result['torch']}; d={c['d_model']}, "
        f"{c['n_layer']} layers, {c['n_head']} heads, trained length {c['train_length']}, batch 1; memory limit "
        f"{result['memory_limit_applied_gib']:g} GiB (asked {result['memory_limit_gib']:g}), time budget "
        f"{result['time_budget_s']} s per scheme; load average {result['load_average_start']} -> "
        f"{result['load_average_end']}\n"
    )
    print("Time per token (µs):\n")
    print("\n".join(table(result, "us_per_token", "{:,.0f}")))
    print(f"\nPeak memory (MiB, {result['memory_measure']}):\n")
    print("\n".join(table(result, "peak_mib", "{:,.0f}")))
    print()
    for scheme, entry in result["reach"].items():
        if entry["beyond"] is not None:
            print(f"- {scheme}: from {entry['beyond']:,} tokens {entry['stopped_by']}")


if __name__ == "__main__":
    main(sys.argv[1])
