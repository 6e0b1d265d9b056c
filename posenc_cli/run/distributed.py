"""Data-parallel training with the standard engine: `torchrun --nproc_per_node=N -m posenc_cli train ...`.

torchrun starts N processes and sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; `train()` reads
them (`env_info`), joins the process group (gloo on CPU, nccl on CUDA; one GPU per process, `cuda:LOCAL_RANK`) and
wraps the model in `DistributedDataParallel`. Without those variables (or with WORLD_SIZE=1) nothing here runs and
training is the single-process code path.

The data split: `train.batch_size` is the global batch and must divide by N. Every rank draws the same global batch
from the same sampler stream (same seed, same restored state on resume) and keeps its own contiguous block of rows
(`shard_rows`), so the ranks see different data and, together, exactly the rows a single process would see; DDP's
gradient average over equal shards is the single-process mean-loss gradient up to summation order. The logged loss
is the all-reduced mean over the global batch; validation splits the rows of the same fixed windows across ranks
and all-reduces the mean, so both equal the single-process values up to summation order. Only rank 0 writes
(checkpoints, metrics, logs, progress events); the other ranks only read the run directory, after rank 0 finished
any interrupted commit (`main_first`). Dropout draws from a per-rank stream (`rank_seed`); with dropout > 0 a
resumed job re-derives the streams of ranks > 0 from (seed, rank, step), so it matches an uninterrupted job in data
order but not bitwise. SIGTERM/SIGINT to torchrun reach every worker; the ranks agree on the step after which they
stop, and rank 0 saves an "interrupted" checkpoint that the same command resumes.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from posenc_cli.errors import ConfigError


@dataclass(frozen=True)
class DistInfo:
    """This process's place in a data-parallel job (rank 0 of 1 without torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


SINGLE = DistInfo()


def env_info(env: Mapping[str, str] | None = None) -> DistInfo:
    """Rank, world size and local rank from torchrun's environment variables (`SINGLE` when absent)."""
    env = os.environ if env is None else env
    try:
        world = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError as e:
        raise ConfigError(f"torchrun environment is malformed ({e})") from e
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"torchrun environment is inconsistent: RANK={rank}, WORLD_SIZE={world}")
    return DistInfo(rank=rank, world_size=world, local_rank=local)


def check_batch(batch_size: int, info: DistInfo) -> int:
    """Rows per rank of a global batch; a `ConfigError` unless the world size divides it."""
    if batch_size % info.world_size:
        raise ConfigError(
            f"train.batch_size={batch_size} is the global batch and must be divisible by the number of processes "
            f"({info.world_size})"
        )
    return batch_size // info.world_size


def shard_rows(batch: Tensor, info: DistInfo, dim: int = 0) -> Tensor:
    """This rank's contiguous block of rows of a global batch along `dim`: rows [r·B/N, (r+1)·B/N)."""
    if not info.enabled:
        return batch
    per = check_batch(batch.shape[dim], info)
    return batch.narrow(dim, info.rank * per, per)


def rank_device(device: torch.device, info: DistInfo) -> torch.device:
    """One GPU per process: `cuda` becomes `cuda:LOCAL_RANK`; other devices are shared as they are."""
    if info.enabled and device.type == "cuda":
        if info.local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"LOCAL_RANK={info.local_rank} but only {torch.cuda.device_count()} GPU(s) are visible; "
                "use --nproc_per_node <= the number of GPUs"
            )
        return torch.device("cuda", info.local_rank)
    return device


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


@contextlib.contextmanager
def process_group(info: DistInfo, device: torch.device) -> Iterator[None]:
    """Join the job's process group for the duration (no-op for a single process or an existing group)."""
    if not info.enabled or dist.is_initialized():
        yield
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend_for(device),
        rank=info.rank,
        world_size=info.world_size,
        timeout=datetime.timedelta(minutes=30),
        device_id=device if device.type == "cuda" else None,
    )
    try:
        yield
    except BaseException:
        dist.destroy_process_group()  # no barrier: the other ranks may never reach one (torchrun stops them)
        raise
    # Leave together: a rank that tears its gloo connections down while another still holds them open (writing the
    # last checkpoint) can bring that rank down with "connection closed by peer"; PyTorch's guide to
    # destroy_process_group asks every rank to call it at a point where communication is over.
    dist.barrier()
    dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


@contextlib.contextmanager
def main_first(info: DistInfo) -> Iterator[None]:
    """Rank 0 runs the body first (recovering or building shared files); the others wait, then run it."""
    if not info.is_main:
        barrier(info)
    yield
    if info.is_main:
        barrier(info)


def all_reduce_(t: Tensor, info: DistInfo, op: str = "sum") -> Tensor:
    """In-place all-reduce ('sum' or 'max') across the job; identity for a single process."""
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t


def rank_seed(seed: int, rank: int, step: int) -> int:
    """Seed of rank r's own random streams (dropout) from step `step` on: a hash of (seed, rank, step) in [0, 2⁶³)."""
    digest = hashlib.sha256(f"posenc-rank-seed/{seed}/{rank}/{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def wrap_model(model: torch.nn.Module, info: DistInfo, device: torch.device) -> torch.nn.Module:
    """`DistributedDataParallel(model)` in a job (rank 0's weights are broadcast to all); the model itself otherwise."""
    if not info.enabled:
        return model

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, output_device=ids[0] if ids else None)


__all__ = [
    "SINGLE",
    "DistInfo",
    "all_reduce_",
    "backend_for",
    "barrier",
    "check_batch",
    "env_info",
    "main_first",
    "process_group",
    "rank_device",
    "rank_seed",
    "shard_rows",
    "wrap_model",
]
