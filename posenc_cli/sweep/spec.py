"""Sweep files: where they are found, and their parsing into a `SweepSpec` of `StageSpec`s.

A sweep file (`configs/sweep/NAME.yaml`, or `sweep/NAME.yaml` in a user's `--config-dir`) declares global overrides
and one or more stages. Each stage is one Hydra multirun (see `hydra_bridge.launch_multirun`): stage `train` jobs
train and evaluate a run; `extend` jobs derive a run from an earlier stage's run (RoPE scaling, optional
fine-tune) and evaluate it. `sweep.plan` expands the stages into jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from posenc_cli.config import suggest
from posenc_cli.errors import ConfigError


@dataclass(kw_only=True)
class StageSpec:
    name: str
    action: Literal["train", "extend"] = "train"
    params: dict[str, str] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    parent: str | None = None
    label: str | None = None


@dataclass(kw_only=True)
class SweepSpec:
    name: str
    path: Path
    overrides: list[str] = field(default_factory=list)
    stages: list[StageSpec] = field(default_factory=list)


def find_sweep_file(name: str, config_dirs: list[Path]) -> Path:
    """`configs/sweep/NAME.yaml`, looked up in the user's config dir first."""
    for root in config_dirs:
        candidate = root / "sweep" / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    available = sorted({p.stem for root in config_dirs for p in (root / "sweep").glob("*.yaml")})
    hint = suggest(name, available)
    raise ConfigError(f"no sweep file named '{name}'{hint} (available: {', '.join(available) or 'none'})")


def load_sweep_spec(path: Path) -> SweepSpec:
    """Parse a sweep file (safe YAML) and check its shape."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from e
    if not isinstance(raw, dict) or not isinstance(raw.get("stages"), list) or not raw["stages"]:
        raise ConfigError(f"{path}: a sweep file needs a non-empty 'stages' list")
    unknown = set(raw) - {"overrides", "stages", "description"}
    if unknown:
        key = str(sorted(unknown, key=str)[0])
        hint = suggest(key, ["description", "overrides", "stages"])
        raise ConfigError(f"{path}: unknown sweep key '{key}'{hint} (valid: description, overrides, stages)")
    stages = []
    for i, st in enumerate(raw["stages"]):
        if not isinstance(st, dict) or "name" not in st:
            raise ConfigError(f"{path}: stage {i} needs a 'name'")
        valid = ["name", "action", "params", "overrides", "parent", "label"]
        bad = set(st) - set(valid)
        if bad:
            key = str(sorted(bad, key=str)[0])
            hint = suggest(key, valid)
            raise ConfigError(
                f"{path}: stage '{st['name']}' has unknown key '{key}'{hint} (valid: {', '.join(sorted(valid))})"
            )
        action = st.get("action", "train")
        if action not in ("train", "extend"):
            raise ConfigError(f"{path}: stage '{st['name']}': action must be train or extend, got {action!r}")
        if action == "extend" and not st.get("parent"):
            raise ConfigError(f"{path}: extend stage '{st['name']}' needs parent: <stage>/<key=value,...>")
        params = {str(k): _param_str(v) for k, v in (st.get("params") or {}).items()}
        stages.append(
            StageSpec(
                name=str(st["name"]),
                action=action,
                params=params,
                overrides=[str(o) for o in st.get("overrides") or []],
                parent=st.get("parent"),
                label=st.get("label"),
            )
        )
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: stage names must be unique")
    return SweepSpec(
        name=Path(path).stem, path=Path(path), overrides=[str(o) for o in raw.get("overrides") or []], stages=stages
    )


def _param_str(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)
