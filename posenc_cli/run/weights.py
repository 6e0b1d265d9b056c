"""What a checkpoint stores of the model: its weights as safetensors bytes (fp32, tied tensors once, a canonical
header) and its tokenizer's files; and the checked way back from the stored tensors into a model."""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import Tensor, nn

from posenc_cli.data.tokenizer import Tokenizer
from posenc_cli.errors import CheckpointError


def model_file_bytes(model: nn.Module) -> bytes:
    """safetensors bytes of `model`'s fp32 state dict, tied tensors stored once (as `save_model` does)."""
    state = model.state_dict()
    tensors: dict[str, Tensor] = {}
    removed: dict[str, str] = {}
    for group in tied_groups(state):
        keep = sorted(group)[0]
        tensors[keep] = state[keep].detach().to("cpu").contiguous()
        removed.update({name: keep for name in group if name != keep})
    return canonical_safetensors(safetensors.torch.save(tensors, metadata={"format": "pt", **removed}))


def canonical_safetensors(data: bytes) -> bytes:
    """The same safetensors bytes with the header's `__metadata__` keys in sorted order.

    safetensors keeps the metadata in a Rust HashMap, whose iteration order is random per map, so two saves of the
    same tensors can differ in their header. Sorting the keys makes a resumed run's file byte-identical to an
    uninterrupted run's. Only the order changes, so the header keeps its length and the tensor offsets stay valid.
    """
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or len(meta) < 2:
        return data
    ordered = {"__metadata__": dict(sorted(meta.items())), **{k: v for k, v in header.items() if k != "__metadata__"}}
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > n:  # a serialisation we do not reproduce exactly: keep the original bytes
        return data
    return data[:8] + text.ljust(n, b" ") + data[8 + n :]


def tied_groups(state: dict[str, Tensor]) -> list[list[str]]:
    """Names of state-dict entries grouped by the storage they share (tied weights share one group)."""
    groups: dict[Any, list[str]] = defaultdict(list)
    for name, t in state.items():
        if t.numel() == 0:
            groups[("empty", name)].append(name)
            continue
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        groups[key].append(name)
    return list(groups.values())


def tokenizer_files(tokenizer: Tokenizer) -> dict[str, bytes]:
    """The files `tokenizer.save(dir)` writes (none for the byte tokenizer), as bytes for `commit_checkpoint`."""
    with tempfile.TemporaryDirectory(prefix="posenc-tok-") as tmp:
        tokenizer.save(Path(tmp))
        return {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}


def load_weights_into(model: nn.Module, tensors: dict[str, Tensor], path: Path) -> None:
    """Check names, shapes, dtypes and finiteness of `tensors` against `model`, then load them."""
    expected = model.state_dict()
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise CheckpointError(f"{path}: unexpected tensor '{unexpected[0]}' (checkpoint of a different model?)")
    full: dict[str, Tensor] = {}
    for group in tied_groups(expected):
        present = [n for n in group if n in tensors]
        if not present:
            raise CheckpointError(f"{path}: missing tensor '{group[0]}'")
        src = tensors[present[0]]
        ref = expected[group[0]]
        if tuple(src.shape) != tuple(ref.shape) or src.dtype != ref.dtype:
            got, want = f"{src.dtype} {tuple(src.shape)}", f"{ref.dtype} {tuple(ref.shape)}"
            raise CheckpointError(f"{path}: tensor '{present[0]}' is {got}, expected {want}")
        if src.is_floating_point() and not bool(torch.isfinite(src).all()):
            raise CheckpointError(f"{path}: tensor '{present[0]}' has non-finite values")
        full.update({n: src for n in group})
    model.load_state_dict(full, strict=True)
