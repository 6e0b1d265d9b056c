"""A sweep job's identity: the config it was planned with (see `sweep.plan`'s module docstring).

The identity is the composed config flattened to dotted keys, without the settings that change only speed or
logging (`config.RUNTIME_KEYS`), plus, for an extend job, its parent's identity hash; `identity_hash` is a canonical
sha256 of it.
`PLANNED_FILE` in a sweep directory keeps each job's identity and hash across sweeps into that directory.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from posenc_cli.config import RUNTIME_KEYS, Config, config_to_dict, flatten, nest_flat_scaling_keys
from posenc_cli.data.sources import config_class as data_config_class
from posenc_cli.errors import ConfigError, UserError
from posenc_cli.fsutil import atomic_write_json
from posenc_cli.positional import config_class as pos_config_class
from posenc_cli.rope_scaling import params_class
from posenc_cli.run.config_compose import group_classes
from posenc_cli.run.layout import CONFIG_FILE
from posenc_cli.untrusted import load_yaml

PLANNED_FILE = "planned.json"  # in a sweep directory: per job, the config it was planned with
# Keys added after identities were first written: left out of an identity at their dataclass default (which must do
# what posenc did before the key existed), so a sweep planned before the key existed still matches its jobs. Only
# the key is listed; its value is the field's default (`field_default`). A key added without a line here changes
# every identity: tests/sweep/test_job_identity.py holds the identities of today's defaults fixed.
ADDED_KEYS = (
    "train.window_start",
    "eval.longppl",
    "extend.layers",
    "train.drope_at",
    "train.loss_on",
    "train.packing",
    "model.temperature_c",
    "model.temperature_form",
    "eval.longppl_evaluator",
    "tokenizer.path",
    "tokenizer.sha256",
    "data.data_files",
    "data.streaming",
    "data.max_tokens",
    "data.shuffle_buffer",
    "data.shuffle_seed",
    "extend.params.mscale",
    "extend.params.mscale_all_dim",
    "pos.scaling.params.mscale",
    "pos.scaling.params.mscale_all_dim",
    "model.attn_sinks",
    "model.attn_gate",
    "model.qk_norm",
    "model.qk_norm_layers",
    "model.canon",
    "data.max_len_per_task",
    "pos.decay_time_min",
    "pos.decay_time_max",
    "pos.logit_bias",
)
_ABSENT = object()


def job_identity(cfg: Config, parent_hash: str | None = None) -> dict[str, Any]:
    """The settings that make a job's numbers what they are: the resolved config, flattened to dotted keys and
    JSON-normalised, without `RUNTIME_KEYS`; an extend job's also names its parent's identity hash."""
    flat = numbers_keys(flatten(config_to_dict(cfg)))
    if parent_hash is not None:
        flat["parent.config_hash"] = parent_hash
    return _normalised(flat)


def identity_hash(identity: dict[str, Any]) -> str:
    """Canonical hash of an identity (sorted keys, JSON): equal configs hash equal across processes and runs."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def run_config_identity(run_dir: Path) -> dict[str, Any] | None:
    """The identity of the config a run directory's own config.yaml holds (None if it has none): what a train job of
    a sweep directory written before `PLANNED_FILE` is compared by. (An extend job's config.yaml holds the derived
    run's settings, not the planned ones, so it is not comparable.)"""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        raw = load_yaml(path, what="a job's config.yaml")
    except (OSError, UserError):
        return None
    if not isinstance(raw, dict):
        return None
    return _normalised(numbers_keys(flatten(raw)))


def numbers_keys(flat: dict[str, Any]) -> dict[str, Any]:
    """The dotted settings that decide a job's numbers: without `RUNTIME_KEYS` and `ADDED_KEYS` at their default
    (applied to recorded identities too, so one planned when a runtime key was still in them compares equal)."""
    flat = nest_flat_scaling_keys(flat)  # identities planned before scaling settings were nested per method
    if not flat.get("train.random_positions"):  # how ids are drawn matters only when they are drawn
        flat = {k: v for k, v in flat.items() if k != "train.random_positions_draw"}
    return {
        k: v
        for k, v in flat.items()
        if not k.startswith(RUNTIME_KEYS) and not (k in ADDED_KEYS and field_default(k, flat) == v)
    }


def field_default(key: str, flat: dict[str, Any]) -> Any:
    """The dataclass default of dotted `key` in the config `flat` describes (a `pos.*` key: of its scheme's class; a
    `data.*` key: of its source's; a scaling's `params.*`: of its method's parameters), JSON-normalised as
    identities are; `_ABSENT` where no class of that config has the field."""
    for scaling in ("extend", "pos.scaling"):
        if key.startswith(f"{scaling}.params."):
            method = flat.get(f"{scaling}.method")
            params = params_class(method) if isinstance(method, str) else None
            return _defaults(params).get(key.removeprefix(f"{scaling}.params."), _ABSENT)
    group, _, name = key.partition(".")
    cls: type | None
    try:
        if group == "pos":
            cls = pos_config_class(str(flat.get("pos.name", "nope")))
        elif group == "data":
            cls = data_config_class(str(flat.get("data.source", "stdlib")))
        else:
            cls = group_classes().get(group)
    except UserError:  # a scheme or source this posenc does not have: no default to compare with
        return _ABSENT
    return _defaults(cls).get(name, _ABSENT)


@functools.cache
def _defaults(cls: type | None) -> dict[str, Any]:
    """Dataclass `cls`'s defaults as dotted keys, JSON-normalised (empty for None)."""
    return {} if cls is None else _normalised(flatten(dataclasses.asdict(cls())))


def read_planned(sweep_dir: Path) -> dict[str, Any]:
    """`PLANNED_FILE`'s jobs: {job key: {"config_hash", "config"}} (empty for a directory without one)."""
    path = Path(sweep_dir) / PLANNED_FILE
    if not path.is_file():
        return {}
    try:
        jobs = json.loads(path.read_text()).get("jobs")
    except (ValueError, AttributeError) as e:
        raise ConfigError(f"{path}: not a posenc sweep record (invalid JSON)") from e
    return jobs if isinstance(jobs, dict) else {}


def difference(job_dir: Path, old: dict[str, Any], new: dict[str, Any]) -> str:
    """'DIR was planned with pos.name=nope; this sweep asks pos.name=alibi (and 2 more settings); ...'."""
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k, "<unset>") != new.get(k, "<unset>")]
    keys.sort(key=lambda k: (not k.endswith(".name"), k.startswith("parent."), k))  # the scheme's name first
    first = keys[0]
    if first == "parent.config_hash":  # the job's own settings agree; its parent's do not
        return (
            f"{job_dir} was derived from a parent run planned with another config than this sweep's; use another "
            "--out, or delete that job's directory to run it again"
        )
    more = f" (and {len(keys) - 1} more setting{'s' if len(keys) > 2 else ''})" if len(keys) > 1 else ""
    return (
        f"{job_dir} was planned with {first}={_show(old.get(first, '<unset>'))}; this sweep asks "
        f"{first}={_show(new.get(first, '<unset>'))}{more}; use another --out, or delete that job's directory to "
        "run it again"
    )


def _show(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")) if isinstance(value, (list, dict)) else str(value)


def write_planned(sweep_dir: Path, identities: dict[str, dict[str, Any]]) -> None:
    """Record this sweep's jobs in `PLANNED_FILE`, keeping the entries of jobs of earlier grids."""
    jobs = read_planned(sweep_dir)
    for key, identity in identities.items():
        jobs[key] = {"config_hash": identity_hash(identity), "config": identity}
    atomic_write_json(Path(sweep_dir) / PLANNED_FILE, {"schema_version": 1, "jobs": jobs})


def _normalised(flat: dict[str, Any]) -> dict[str, Any]:
    """As the values read back from JSON (tuples as lists, paths as strings), so a record and a plan compare equal."""
    out: dict[str, Any] = json.loads(json.dumps(flat, default=str))
    return out
