"""Data-parallel training under torchrun: 2 CPU processes (gloo) follow the single-process loss trajectory of the same
global batch, only rank 0 writes, and a crashed job resumes from its checkpoint.

Tolerance: the ranks' half-batch losses and DDP's gradient average equal the single process's full-batch mean up to
floating-point summation order (~1e-7 relative per step in fp32); over 8 AdamW steps of this tiny model the
trajectories stay within 1e-5 relative, which is the bound asserted. Weights are compared with an absolute 2e-5 as
well: AdamW divides each gradient by its own running RMS, so for a weight whose gradient is ~0 summation-order noise
changes the update's size (at most lr = 3e-3 per step); observed differences are ~2e-6.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_utils import tiny_config, tiny_overrides, weights, write_corpus

from posenc_cli.errors import ConfigError
from posenc_cli.run import distributed
from posenc_cli.run.distributed import DistInfo, env_info, rank_seed, shard_rows
from posenc_cli.run.meta import read_meta
from posenc_cli.run.train import train

pytestmark = pytest.mark.integration  # end to end (sweeps, launchers, DDP, compile): not in the fast lane

RTOL = 1e-5
STEPS = dict(steps=8, save_every=4, eval_every=4, batch_size=4)


def test_env_info_reads_torchrun_variables() -> None:
    assert env_info({}) == DistInfo()
    assert env_info({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == DistInfo(1, 2, 1)
    with pytest.raises(ConfigError, match="inconsistent"):
        env_info({"RANK": "2", "WORLD_SIZE": "2"})


def test_shards_are_the_blocks_of_the_global_batch() -> None:
    batch = torch.arange(24).view(6, 4)
    parts = [shard_rows(batch, DistInfo(r, 3, r)) for r in range(3)]
    assert torch.equal(torch.cat(parts), batch)  # disjoint, in order, nothing left out
    assert torch.equal(shard_rows(batch, DistInfo()), batch)
    windows = torch.arange(2 * 6 * 3).view(2, 6, 3)
    assert torch.equal(shard_rows(windows, DistInfo(1, 2, 1), dim=1), windows[:, 3:])
    with pytest.raises(ConfigError, match="divisible by the number of processes"):
        distributed.check_batch(5, DistInfo(0, 2, 0))


def test_rank_seeds_differ_between_ranks_and_are_reproducible() -> None:
    seeds = {rank_seed(0, r, 0) for r in range(4)}
    assert len(seeds) == 4 and rank_seed(0, 1, 5) == rank_seed(0, 1, 5) != rank_seed(0, 1, 6)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


NAN_TRAIN = Path(__file__).with_name("nan_train.py")


def torchrun(overrides: list[str], out: Path, nan_at: int | None = None) -> subprocess.CompletedProcess:
    """`posenc train` on 2 ranks; `nan_at`: its loss turns NaN at that step on every rank (`nan_train.py`)."""
    # --tee 3: each worker's stdout and stderr reach ours, prefixed by its rank, so a failure shows the rank's own
    # message and not only torchrun's summary
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--tee", "3"]
    cmd += ["-m", "posenc_cli"] if nan_at is None else [str(NAN_TRAIN), str(nan_at)]
    cmd += ["train", *overrides, "--out", str(out)]
    env = dict(os.environ) | {"OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def worker_lines(proc: subprocess.CompletedProcess, limit: int = 4000) -> str:
    """The workers' own lines of a torchrun (rank-prefixed by --tee), then the tail of torchrun's summary."""
    text = proc.stdout + proc.stderr
    ranks = "\n".join(line for line in text.splitlines() if line.startswith("[default"))
    return (ranks[-limit:] + "\n---\n" + text[-1500:]).strip()


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_two_ranks_match_one_process_and_resume_after_a_crash(corpus: Path, tmp_path: Path) -> None:
    single = tmp_path / "single"
    train(tiny_config(corpus, **STEPS), single)

    ddp = tmp_path / "ddp"
    overrides = tiny_overrides(corpus, **STEPS)
    crashed = torchrun(overrides, ddp, nan_at=6)  # every rank sees the all-reduced NaN loss at step 6
    assert crashed.returncode != 0
    assert "non-finite loss" in crashed.stderr + crashed.stdout
    assert read_meta(ddp)["step"] == 4  # the last checkpoint rank 0 wrote
    done = torchrun(overrides, ddp)  # same command: continues from step 4
    assert done.returncode == 0, worker_lines(done)
    assert read_meta(ddp)["status"] == "complete" and read_meta(ddp)["step"] == 8
    assert done.stdout.count("training summary") == 1  # rank 0 reports, the other rank stays quiet

    ours, ref = records(ddp), records(single)
    assert [r["step"] for r in ours] == list(range(1, 9))  # one writer: no step logged twice, none lost
    assert [r["tokens"] for r in ours] == [r["tokens"] for r in ref]  # global batch, not per-rank
    for key in ("train_loss", "grad_norm", "val_loss"):
        a = [r[key] for r in ours if r[key] is not None]
        b = [r[key] for r in ref if r[key] is not None]
        assert len(a) == len(b) > 0
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=RTOL, atol=0)
    w_ddp, w_single = weights(ddp), weights(single)
    for name, value in w_single.items():
        torch.testing.assert_close(w_ddp[name], value, rtol=RTOL, atol=2e-5)


def test_two_ranks_pool_the_scored_targets_of_the_global_batch(tmp_path: Path) -> None:
    """train.loss_on=answer with padded rows: each rank's share is its NLL sum over the step's count of scored
    targets, so 2 ranks × 2 micro-batches follow one process's mean over the same global batch."""
    from posenc_cli.data.sources.algorithmic import AlgorithmicDataConfig

    data = ["data=algorithmic", "data.tasks=[copy,reverse]", "data.examples=300", "data.max_length=4"]
    settings = dict(STEPS, grad_accum=2, seq_len=32, loss_on="answer", packing="none")
    overrides = [o for o in tiny_overrides(Path("unused"), **settings) if not o.startswith("data.")]
    overrides = [o for o in overrides if o != "data=text"] + data
    single_cfg = tiny_config(Path("unused"), **settings)
    single_cfg.data = AlgorithmicDataConfig(tasks=["copy", "reverse"], examples=300, max_length=4)
    single = tmp_path / "single"
    train(single_cfg, single)
    ddp = tmp_path / "ddp"
    done = torchrun(overrides, ddp)
    assert done.returncode == 0, worker_lines(done)
    ours, ref = records(ddp), records(single)
    assert [r["tokens"] for r in ours] == [r["tokens"] for r in ref]
    for key in ("train_loss", "grad_norm", "val_loss"):
        a = [r[key] for r in ours if r[key] is not None]
        b = [r[key] for r in ref if r[key] is not None]
        assert len(a) == len(b) > 0
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=RTOL, atol=0)
