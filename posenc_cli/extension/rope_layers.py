"""Which RoPE layers an extension changes, for a plain RoPE run and for a per-layer layout (`positional.layout`).

`extend.layers` (`posenc extend --layers`) chooses the rule:

- `global` (default): the RoPE layers that attend over the whole context (full span). A sliding-window or
  chunked layer never sees a distance beyond its window, at any length, so scaling its frequencies only moves it
  away from what it was trained on. This is Gemma 3's rule: its long-context variants rescale the global layers'
  RoPE (base 1M, linear factor 8) and keep the local layers' base 10k (Gemma Team 2025, arXiv 2503.19786, §5;
  `transformers` Gemma 3 configs carry `rope_parameters` for `full_attention` only with a scaling).
- `all`: every RoPE layer, windowed or not.

A plain RoPE run has one scheme in every layer and full attention, so both rules scale it. A layout whose rule
selects no RoPE layer (iRoPE and RNoPE-SWA have only windowed RoPE layers under `global`) is refused in one line:
there is nothing to extend, and its global layers are NoPE.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from posenc_cli.config import Config, PosConfig, replace
from posenc_cli.errors import ConfigError
from posenc_cli.extension.settings import LAYER_RULES
from posenc_cli.positional.layout import LayoutConfig, parse_entry
from posenc_cli.positional.rope import RopeConfig


def rope_entries(cfg: Config, rule: str, run_dir: Path | str, what: str = "frequency scaling (extend)") -> list[int]:
    """The `pos.layers` indexes of a layout's RoPE entries that `rule` selects ([] for a plain RoPE run, whose
    one scheme is changed); a one-line `ConfigError` for another scheme, an unknown rule or no such entry."""
    if rule not in LAYER_RULES:
        raise ConfigError(f"extend.layers must be one of {', '.join(LAYER_RULES)}, got {rule!r}")
    pos = cfg.pos
    if isinstance(pos, RopeConfig):
        return []
    if not isinstance(pos, LayoutConfig):
        raise ConfigError(f"{run_dir} uses pos={pos.name}; {what} applies only to RoPE checkpoints")
    entries = pos.entries()
    rope = [i for i, e in enumerate(entries) if isinstance(e.pos, RopeConfig)]
    chosen = [i for i in rope if rule == "all" or entries[i].span == "full"]
    if not chosen:
        why = "has no RoPE layer" if not rope else "has no global RoPE layer (its RoPE layers are windowed)"
        hint = "" if not rope else "; --layers all scales the windowed ones"
        raise ConfigError(f"{run_dir} (pos={pos.name}) {why}: nothing for {what} to change{hint}")
    return chosen


def rope_settings(cfg: Config, entries: list[int]) -> RopeConfig:
    """The RoPE options the extension starts from: the run's, or the first selected layer entry's."""
    if not entries:
        assert isinstance(cfg.pos, RopeConfig)
        return cfg.pos
    assert isinstance(cfg.pos, LayoutConfig)
    rope = parse_entry(cfg.pos.layers[entries[0]], f"pos.layers[{entries[0]}]").pos
    assert isinstance(rope, RopeConfig)
    return rope


def selected_settings(cfg: Config, entries: list[int]) -> list[RopeConfig]:
    """Every selected RoPE config (one for a plain run), e.g. to check a scaling against each layer's base."""
    if not entries:
        return [rope_settings(cfg, [])]
    assert isinstance(cfg.pos, LayoutConfig)
    return [parse_entry(cfg.pos.layers[i], f"pos.layers[{i}]").pos for i in entries]  # type: ignore[misc]


def with_rope_options(pos: PosConfig, entries: list[int], **options: Any) -> PosConfig:
    """`pos` with RoPE `options` (e.g. `scaling=`, `remap=`) set: on the run's RoPE config, or on the selected
    layer entries of a layout (the others unchanged)."""
    if not entries:
        return replace(pos, **options)
    assert isinstance(pos, LayoutConfig)
    layers = list(pos.layers)
    for i in entries:
        layers[i] = {**layers[i], **{k: dataclasses.asdict(v) for k, v in options.items()}}
    return replace(pos, layers=layers)


def describe_entries(cfg: Config, entries: list[int], rule: str) -> dict[str, Any] | None:
    """The extension record's `layers` for a layout (None for a plain run, whose records stay as they were)."""
    if not entries:
        return None
    assert isinstance(cfg.pos, LayoutConfig)
    return {"rule": rule, "entries": entries, "of": len(cfg.pos.layers)}
