"""Published train-short-test-long numbers, kept as data, and posenc's ratios set beside them.

The papers trained word-level models of hundreds of millions of parameters, so only ratios and orderings compare
with posenc's tiny byte-level models: a table here reports ppl(L') / ppl(L) per scheme, posenc's next to the
paper's, at the paper's length multiples (`posenc compare DIR --reference alibi-table2`; the sweep
`configs/sweep/alibi-paper.yaml` evaluates at those multiples).

`separated_best` is the rule for marking a "best" value when a table has seeds: only when the best mean is separated
from the next by more than the seed spread (their ± 1 std intervals do not overlap).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posenc_cli.errors import ConfigError

__all__ = [
    "REFERENCE_TABLES",
    "ReferenceTable",
    "length_notes",
    "posenc_ratios",
    "reference_table",
    "separated_best",
    "side_by_side",
]

SAME_LENGTH = 0.005  # posenc's multiple within 0.5% of the paper's counts as the same length (1.98 for 1012/512)


@dataclass(frozen=True, kw_only=True)
class ReferenceTable:
    """Perplexities as printed: `rows[scheme][i]` at `lengths[i]` tokens (None: not reported, e.g. out of memory)."""

    name: str
    citation: str
    train_length: int
    lengths: tuple[int, ...]
    rows: Mapping[str, tuple[float | None, ...]]  # posenc scheme name -> perplexities

    @property
    def multiples(self) -> tuple[float, ...]:
        return tuple(n / self.train_length for n in self.lengths)

    def ratios(self, scheme: str) -> list[float | None]:
        """ppl(L') / ppl(L) at every length (the first is 1)."""
        values = self.rows[scheme]
        first = values[0]
        return [None if v is None or first is None else v / first for v in values]


ALIBI_TABLE2 = ReferenceTable(
    name="alibi-table2",
    citation=(
        "Press, Smith & Lewis 2022, Train Short, Test Long: Attention with Linear Biases Enables Input Length "
        "Extrapolation (ICLR 2022, arXiv:2108.12409), Table 2: WikiText-103 validation perplexity, trained at "
        "L = 512, non-overlapping evaluation"
    ),
    train_length=512,
    lengths=(512, 1012, 2512, 4512, 8512, 15512),
    rows={
        "sinusoidal": (20.05, 43.54, 132.41, 209.37, 305.65, 406.01),
        "rope": (20.07, 21.37, 31.58, 39.15, 54.98, 79.25),
        "t5": (19.65, 18.79, 20.41, 25.91, 43.08, None),  # 15512: out of memory in the paper
        "alibi": (19.73, 18.73, 18.41, 18.41, 18.34, 18.31),
    },
)

REFERENCE_TABLES: dict[str, ReferenceTable] = {t.name: t for t in (ALIBI_TABLE2,)}


def reference_table(name: str) -> ReferenceTable:
    if name not in REFERENCE_TABLES:
        raise ConfigError(f"--reference {name}: unknown table (available: {', '.join(REFERENCE_TABLES)})")
    return REFERENCE_TABLES[name]


def _nearest(multiples: Iterable[float], target: float, tolerance: float = 0.03) -> float | None:
    """The multiple within `tolerance` (relative) of `target`, if any."""
    close = [m for m in multiples if abs(m - target) <= tolerance * target]
    return min(close, key=lambda m: abs(m - target)) if close else None


def posenc_ratios(results: Sequence[Mapping[str, Any]], multiples: Sequence[float]) -> dict[str, dict[str, Any]]:
    """Per label: {"scheme", "ratios": [[per-run ratio, ...] per multiple], "at": [{posenc multiples used} per
    multiple]} of ppl(m·L) / ppl(1·L).

    `results` are eval-extrapolate result docs with a "label" (compare's `to_results`); a run contributes at a
    multiple when it has an "ok" entry within 3% of it and one at 1× (`at` says which multiple it was).
    """
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        ppl = {float(e["multiple"]): e["ppl"] for e in r.get("entries", []) if e.get("status") == "ok" and e.get("ppl")}
        row = out.setdefault(str(r.get("label") or r.get("run")), {"scheme": r.get("scheme"), "ratios": []})
        if not row["ratios"]:
            row["ratios"] = [[] for _ in multiples]
            row["at"] = [set() for _ in multiples]
        base = _nearest(ppl, 1.0)
        for i, m in enumerate(multiples):
            at = _nearest(ppl, m)
            if base is not None and at is not None:
                row["ratios"][i].append(ppl[at] / ppl[base])
                row["at"][i].add(at)
    return out


def _differs(ours: float, paper: float) -> bool:
    return abs(ours - paper) > SAME_LENGTH * paper


def _mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def side_by_side(table: ReferenceTable, results: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of strings: one row per posenc label whose scheme the table has, "posenc / paper" per length.

    A posenc value with seeds reads "mean ± std"; "–" is not measured (or n/a); the paper's missing value is "oom".
    A posenc value measured at another multiple than the paper's (2× under 1.98×, more than `SAME_LENGTH` apart)
    is marked "*" (`length_notes` says which).
    """
    headers = ["run", "scheme"] + [f"{m:.3g}× ({n})" for m, n in zip(table.multiples, table.lengths, strict=True)]
    rows: list[list[str]] = []
    for label, row in posenc_ratios(results, table.multiples).items():
        scheme = str(row["scheme"])
        if scheme not in table.rows:
            continue
        cells = [label, scheme]
        for values, at, m, paper in zip(row["ratios"], row["at"], table.multiples, table.ratios(scheme), strict=True):
            mean, std = _mean_std(values)
            ours = "–" if mean is None else f"{mean:.3f}" + (f" ± {std:.3f}" if std is not None else "")
            mark = "*" if any(_differs(a, m) for a in at) else ""
            cells.append(f"{ours}{mark} / {'oom' if paper is None else f'{paper:.2f}'}")
        rows.append(cells)
    return headers, rows


def length_notes(table: ReferenceTable, results: Sequence[Mapping[str, Any]]) -> list[str]:
    """'* 2× (posenc) under the paper's 1.98× (1012 tokens at L = 512): not the same length' for every paper column
    a shown posenc value was measured at another multiple for."""
    shown = {k: v for k, v in posenc_ratios(results, table.multiples).items() if str(v["scheme"]) in table.rows}
    notes = []
    for i, (m, n) in enumerate(zip(table.multiples, table.lengths, strict=True)):
        used = sorted({a for row in shown.values() for a in row["at"][i] if _differs(a, m)})
        if used:
            ours = ", ".join(f"{a:g}×" for a in used)
            notes.append(
                f"* posenc measured {ours} under the paper's {m:.3g}× ({n} tokens at L = {table.train_length}): "
                "not the same length; evaluate at the paper's multiples to compare like with like."
            )
    return notes


def separated_best(cells: Mapping[str, tuple[float, float | None]], *, lower_is_better: bool = True) -> str | None:
    """The label to mark best among {label: (mean, std)}, or None when the best is within the seed spread.

    Best is marked only when its mean ± std interval does not overlap the runner-up's (a missing std counts as 0,
    so single-seed values are marked as before). Non-finite means are ignored.
    """
    ranked = sorted(
        ((m if lower_is_better else -m, s or 0.0, k) for k, (m, s) in cells.items() if math.isfinite(m)),
    )
    if not ranked:
        return None
    if len(ranked) == 1:
        return ranked[0][2]
    (m1, s1, best), (m2, s2, _) = ranked[0], ranked[1]
    return best if m2 - m1 > s1 + s2 else None
