"""The resume state: optimizer and RNG states as safetensors tensors plus JSON scalars (never a pickle), packed for
a checkpoint and checked before they are restored."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch
from torch import Tensor

from posenc_cli.errors import CheckpointError
from posenc_cli.run.journal import committed_file
from posenc_cli.run.layout import META_FILE, STATE_FILE, STATE_JSON
from posenc_cli.run.meta import is_whole_number
from posenc_cli.run.verified import load_tensors, read_verified
from posenc_cli.untrusted import loads_json


def pack_optimizer(optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict[str, Any]]:
    state = optimizer.state_dict()
    tensors: dict[str, Tensor] = {}
    extra: dict[str, dict[str, Any]] = {}
    for pid, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, Tensor):
                tensors[f"optim.{pid}.{key}"] = value.detach().to("cpu").contiguous()
            else:
                extra.setdefault(str(pid), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "extra": extra}


def unpack_optimizer(
    optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor], info: dict[str, Any], path: Path
) -> None:
    current = optimizer.state_dict()["param_groups"]
    groups = info.get("param_groups")
    if not isinstance(groups, list) or [g.get("params") for g in groups] != [g["params"] for g in current]:
        raise CheckpointError(f"{path}: optimizer state does not match this model's parameters")
    state: dict[int, dict[str, Any]] = defaultdict(dict)
    for name, t in tensors.items():
        if name.startswith("optim."):
            _, pid, key = name.split(".", 2)
            state[int(pid)][key] = t
    for pid, entries in (info.get("extra") or {}).items():
        state[int(pid)].update(entries)
    for g in groups:
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
    check_optimizer_state(optimizer, state, groups, path)
    try:
        optimizer.load_state_dict({"state": dict(state), "param_groups": groups})
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(f"{path}: optimizer state could not be restored ({e})") from e


def check_optimizer_state(
    optimizer: torch.optim.Optimizer, state: dict[int, dict[str, Any]], groups: list[Any], path: Path
) -> None:
    """Before AdamW sees it: every moment has its parameter's shape and dtype and is finite (exp_avg_sq >= 0),
    every step is a finite whole number >= 0, and the groups' hyperparameters are numbers in range. A wrong-shaped
    moment would otherwise crash the fused kernel or be broadcast silently."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for g in groups:
        betas = g.get("betas")
        numbers = [g.get("lr"), g.get("eps"), g.get("weight_decay"), *(betas if isinstance(betas, tuple) else [None])]
        if not all(_finite_number(v) and v >= 0 for v in numbers) or not all(0 <= b < 1 for b in betas):
            raise CheckpointError(f"{path}: optimizer hyperparameters are invalid")
    for pid, entries in state.items():
        if not 0 <= pid < len(params):
            raise CheckpointError(f"{path}: optimizer state for parameter {pid}, which this model does not have")
        p = params[pid]
        for key, value in entries.items():
            if key == "step":
                v = float(value) if isinstance(value, Tensor) and value.numel() == 1 else value
                if not _finite_number(v) or v < 0 or v != int(v):
                    raise CheckpointError(f"{path}: optimizer step of parameter {pid} is invalid")
            elif key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                if not isinstance(value, Tensor) or value.shape != p.shape or value.dtype != p.dtype:
                    got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__
                    raise CheckpointError(
                        f"{path}: optimizer {key} of parameter {pid} is {got}, expected {p.dtype} {tuple(p.shape)}"
                    )
                if not bool(torch.isfinite(value).all()) or (key != "exp_avg" and bool((value < 0).any())):
                    raise CheckpointError(f"{path}: optimizer {key} of parameter {pid} has invalid values")
            else:
                raise CheckpointError(f"{path}: unexpected optimizer state '{key}' for parameter {pid}")


def _finite_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def capture_rng(sampler: torch.Generator) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """RNG states of python, numpy, torch (CPU and CUDA) and the batch sampler."""
    tensors = {"rng.torch": torch.get_rng_state(), "rng.sampler": sampler.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)
    tensors["rng.numpy"] = torch.from_numpy(np_state[1].astype(np.int64))
    py_version, py_state, py_gauss = random.getstate()
    info = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": {"name": np_state[0], "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "gauss": np_state[4]},
    }
    return tensors, info


def restore_rng(
    tensors: dict[str, Tensor], info: dict[str, Any], sampler: torch.Generator, *, sampler_too: bool = True
) -> None:
    try:
        version, state, gauss = info["python"]
        random.setstate((version, tuple(state), gauss))
        n = info["numpy"]
        keys = tensors["rng.numpy"].numpy().astype(np.uint32)
        np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["gauss"]))
        torch.set_rng_state(tensors["rng.torch"])
        torch.Generator().set_state(tensors["rng.sampler"])  # checked before anything is changed below
    except (TypeError, ValueError, KeyError, IndexError, RuntimeError) as e:
        raise CheckpointError(f"resume state: the saved random-number state is invalid ({type(e).__name__})") from e
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    if sampler_too:
        sampler.set_state(tensors["rng.sampler"])


def state_file_bytes(tensors: dict[str, Tensor]) -> bytes:
    return safetensors.torch.save(tensors, metadata={"format": "pt"})


def read_state(run_dir: Path, meta: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The verified resume state: (tensors, scalars)."""
    tensors = load_tensors(run_dir, meta, STATE_FILE)
    path = committed_file(run_dir, STATE_JSON)
    info = loads_json(
        read_verified(run_dir, meta["files"], STATE_JSON), source=path, what="resume state", error=CheckpointError
    )
    required = ("step", "tokens", "optimizer", "rng")
    if not isinstance(info, dict) or any(k not in info for k in required):
        raise CheckpointError(f"{path}: incomplete resume state")
    counts = (info["step"], info["tokens"])
    if (
        not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts)
        or info["step"] != meta["step"]
    ):
        raise CheckpointError(f"{path}: step or tokens are not whole numbers >= 0 matching {META_FILE}")
    for key in ("elapsed_s", "best_val_loss", "train_loss", "val_loss"):
        if info.get(key) is not None and not (isinstance(info[key], int | float) and not isinstance(info[key], bool)):
            raise CheckpointError(f"{path}: {key} is not a number")
    if not isinstance(info["optimizer"], dict) or not isinstance(info["optimizer"].get("extra", {}), dict):
        raise CheckpointError(f"{path}: optimizer state is not a mapping")
    groups = info["optimizer"].get("param_groups")
    if not isinstance(groups, list) or not all(
        isinstance(g, dict) and isinstance(g.get("params"), list) and all(is_whole_number(i) for i in g["params"])
        for g in groups
    ):
        raise CheckpointError(f"{path}: field 'optimizer.param_groups' is not a list of groups with parameter ids")
    extra = info["optimizer"].get("extra", {})
    if not all(isinstance(k, str) and k.isdigit() and isinstance(v, dict) for k, v in extra.items()):
        raise CheckpointError(f"{path}: field 'optimizer.extra' is not a mapping of parameter ids to mappings")
    if not isinstance(info["rng"], dict):
        raise CheckpointError(f"{path}: field 'rng' is not a mapping")
    missing = [k for k in ("rng.torch", "rng.sampler", "rng.numpy") if k not in tensors]
    if missing:
        raise CheckpointError(f"{committed_file(run_dir, STATE_FILE)}: missing tensor '{missing[0]}'")
    return tensors, info
