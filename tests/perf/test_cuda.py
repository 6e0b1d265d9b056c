"""posenc on an NVIDIA GPU: bf16 autocast training, the chunked attention-bias path in bf16 against fp32, bias
precision at 8k tokens, and data-parallel training over NCCL. Every test is marked `cuda` and skips without CUDA
(`benchmarks/gpu-check.sh` runs them with `pytest -m cuda`).

Tolerances (relative Frobenius error of the logits, ‖a − b‖ / ‖b‖): fp32 against fp64 at 1e-4 (TF32 is off in
PyTorch's default for matmuls, so fp32 products keep ~1e-6 relative error; the bias itself adds m·|i − j| up to
~4·10³ at 8k, where fp32 keeps ~5e-4 absolute, far below a softmax's sensitivity for the near keys that matter);
bf16 autocast against fp32 at 5e-2 (bf16 keeps 8 bits of mantissa: ~4e-3 per rounding, compounded over 2 layers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from attention_utils import force_chunks
from train_utils import tiny_config, tiny_overrides, write_corpus

from posenc_cli.config import ModelConfig
from posenc_cli.model import GPT
from posenc_cli.positional import config_class

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run benchmarks/gpu-check.sh there)"),
]

BIAS_SCHEMES = ("alibi", "t5", "fire")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def model_for(scheme: str, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=64, n_layer=2, n_head=4)
    return GPT(cfg, config_class(scheme)(), vocab_size=257, train_length=128).cuda().eval()


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path)


def test_auto_precision_is_bf16_on_a_bf16_gpu() -> None:
    from posenc_cli.run.device import resolve_device, resolve_precision

    device = resolve_device("auto")
    assert device.type == "cuda"
    assert resolve_precision("auto", device) == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")


def test_bf16_autocast_training_on_cuda(corpus: Path, tmp_path: Path) -> None:
    from posenc_cli.run.meta import read_meta
    from posenc_cli.run.train import train

    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    cfg = tiny_config(corpus, pos="alibi", device="cuda", precision="bf16", steps=12, save_every=6, eval_every=6)
    result = train(cfg, tmp_path / "run")
    meta = read_meta(tmp_path / "run")
    assert result.stopped_reason == "complete" and meta["precision"] == "bf16" and meta["device"].startswith("cuda")
    losses = [json.loads(x)["train_loss"] for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


@pytest.mark.parametrize("scheme", BIAS_SCHEMES)
def test_chunked_bias_path_matches_one_chunk_and_bf16_stays_close(scheme: str) -> None:
    model = model_for(scheme)
    x = torch.randint(0, 257, (2, 1024), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.inference_mode():
        force_chunks(model, 1024)
        whole = model(x)  # (B, T, V) in fp32, one chunk
        force_chunks(model, 96)  # chunks that do not divide T
        chunked = model(x)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            chunked_bf16 = model(x).float()
    assert rel_err(chunked, whole) < 1e-5
    assert rel_err(chunked_bf16, whole) < 5e-2


@pytest.mark.parametrize("scheme", BIAS_SCHEMES)
def test_bias_precision_at_8k_tokens(scheme: str) -> None:
    model = model_for(scheme, seed=2)
    x = torch.randint(0, 257, (1, 8192), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    with torch.inference_mode():
        ref = model.double()(x)  # fp64 reference on the same device
        fp32 = model.float()(x)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            bf16 = model(x).float()
    assert torch.isfinite(fp32).all() and torch.isfinite(bf16).all()
    assert rel_err(fp32, ref) < 1e-4
    assert rel_err(bf16, ref) < 5e-2
    # The last position sees all 8192 keys: its logits must be as good as the average position's.
    assert rel_err(bf16[:, -1], ref[:, -1]) < 5e-2


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="DDP over NCCL needs at least 2 GPUs")
def test_ddp_over_nccl_matches_one_process(corpus: Path, tmp_path: Path) -> None:
    from posenc_cli.run.meta import read_meta
    from posenc_cli.run.train import train

    steps = dict(steps=8, save_every=4, eval_every=4, batch_size=4, device="cuda")
    train(tiny_config(corpus, **steps), tmp_path / "single")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "posenc_cli", "train", *tiny_overrides(corpus, **steps), "--out", str(tmp_path / "ddp")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert read_meta(tmp_path / "ddp")["status"] == "complete"

    def losses(run: Path) -> torch.Tensor:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return torch.tensor([json.loads(line)["train_loss"] for line in lines])

    # GPU reductions are not bit-reproducible across process layouts; 8 steps stay within 1e-4 relative.
    torch.testing.assert_close(losses(tmp_path / "ddp"), losses(tmp_path / "single"), rtol=1e-4, atol=0)
