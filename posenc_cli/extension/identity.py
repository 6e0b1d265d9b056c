"""How an extension already in the output directory differs from the one asked for, in one short phrase.

`extend` reuses (or resumes) an existing child only when its recorded settings equal the new ones in every key that
changes the child's weights or numbers; otherwise the refusal names the first differing entry of each such key, with
both values shortened, e.g. "scaling.factor: 4 there, 8 asked; logn: none there, {'length': 16} asked".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["differences"]


def differences(old: dict[str, Any], new: dict[str, Any], keys: Sequence[str]) -> list[str]:
    """One phrase per key of `keys` whose value differs between the records `old` and `new` (empty: the same)."""
    return [_differs(k, old, new) for k in keys if old.get(k) != new.get(k)]


def _differs(key: str, old: dict[str, Any], new: dict[str, Any]) -> str:
    """'scaling.factor: 4 there, 8 asked' (the first differing leaf of a record key, values shortened)."""
    a, b = old.get(key), new.get(key)
    while isinstance(a, dict) and isinstance(b, dict):  # down to the first differing leaf (scaling.params.beta_fast)
        sub = next(k for k in [*a, *(k for k in b if k not in a)] if a.get(k) != b.get(k))
        key, a, b = f"{key}.{sub}", a.get(sub), b.get(sub)
    return f"{key}: {_short(a)} there, {_short(b)} asked"


def _short(value: Any, limit: int = 40) -> str:
    text = "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
