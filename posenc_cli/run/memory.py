"""Will a model fit? An up-front parameter and memory estimate, checked before anything is allocated.

A config asking for `model.d_model=100000 model.n_layer=100` (or a hostile `config.yaml` in a run directory) would
otherwise fail deep inside the allocator, or swap the machine to a halt. The estimate counts the GPT block of
`posenc_cli.model` (fused qkv, output projection, MLP of `mlp_ratio`·d, two norms, tied embeddings) and is
compared with the memory the system says is available (MemAvailable, and the cgroup limit where one is set).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from posenc_cli.config import Config, ModelConfig
from posenc_cli.errors import ConfigError

# fp32 weights + gradients + AdamW's two moments (Kingma & Ba 2015): 4 copies of 4 bytes per parameter
TRAIN_BYTES_PER_PARAM = 16
# loading a checkpoint holds the file's tensors and the model's at once: 2 copies of 4 bytes
LOAD_BYTES_PER_PARAM = 8


def approx_params(model: ModelConfig, vocab_size: int, table_length: int = 0) -> int:
    """Parameters of a GPT of these sizes (biases and norms included; a learned position table of
    `table_length` rows when the scheme has one; other schemes' few parameters are left out)."""
    d, hidden = model.d_model, model.mlp_ratio * model.d_model
    per_layer = 4 * d * d + 2 * d * hidden + (4 * d + hidden + d if model.bias else 0) + 4 * d
    return model.n_layer * per_layer + vocab_size * d + table_length * d + 2 * d


def available_memory() -> int | None:
    """Bytes of memory available to this process (None where the system does not say)."""
    found: list[int] = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    return min(found) if found else None


def check_fits(cfg: Config, vocab_size: int, bytes_per_param: int, what: str, available: int | None = None) -> None:
    """`ConfigError` (one line, before any allocation) when `cfg`'s model needs more memory than is available."""
    table = cfg.train.seq_len if cfg.pos.name == "learned" else 0
    n = approx_params(cfg.model, vocab_size, table)
    need = n * bytes_per_param
    available = available_memory() if available is None else available
    if available is not None and need > available:
        m = cfg.model
        raise ConfigError(
            f"model.d_model={m.d_model} model.n_layer={m.n_layer} is about {n:.3g} parameters: {what} needs about "
            f"{gib(need)} of memory and {gib(available)} is available"
        )


def planned_vocab_size(cfg: Config) -> int:
    """The vocabulary a run of `cfg` will have, known before its tokenizer is built (bytes: 256 + end-of-document;
    a pretrained tokenizer's own, read from `tokenizer.path` when it is there)."""
    if cfg.tokenizer.kind == "hf":
        # deferred: keeps numpy and tokenizers off posenc --help start-up
        from posenc_cli.data.tokenizer import pretrained_vocab_size

        return pretrained_vocab_size(cfg.tokenizer.path) or cfg.tokenizer.vocab_size
    return 257 if cfg.tokenizer.kind == "byte" else cfg.tokenizer.vocab_size


# A lower bound on what one training micro-batch keeps for the backward pass, per token: the block's saved
# activations (normed input, q/k/v, attention output, the second normed input, the MLP's two hidden tensors:
# (7 + 2·mlp_ratio)·d values per layer) in bf16 or fp32, at least 2 bytes each, and the fp32 logits with their
# log-softmax (2·V values of 4 bytes). Attention scores (T² per head) are left out: fused kernels do not keep them.
def micro_batch_bytes(model: ModelConfig, vocab_size: int, batch_size: int, seq_len: int) -> int:
    """Bytes one forward+backward of `batch_size` × `seq_len` tokens needs at least (see the comment above)."""
    per_token = model.n_layer * (7 + 2 * model.mlp_ratio) * model.d_model * 2 + 2 * vocab_size * 4
    return batch_size * seq_len * per_token


def validation_bytes(batch_size: int, seq_len: int, eval_batches: int) -> int:
    """Bytes `validation_batches` allocates at once: the window starts (float64, then int64), the gather index
    and the gathered int64 tokens, (n·B, T+1) each."""
    rows = eval_batches * batch_size
    return rows * 16 + rows * (seq_len + 1) * 16


# The fastest a micro-step can go, for refusing steps that can never finish: 1e15 FLOP/s is above any one
# accelerator's dense bf16 peak (NVIDIA H200 SXM: 989 TFLOP/s), and 20 µs is less than the kernel launches a
# forward and backward pass of even one layer issue. Training costs 6·N FLOPs per token (Kaplan et al. 2020, §2.1).
PEAK_FLOPS = 1e15
MIN_MICRO_STEP_S = 2e-5
MAX_STEP_S = 86_400.0  # an optimizer step that cannot finish within a day at that speed is refused


def step_seconds_at_least(n_params: int, batch_size: int, seq_len: int, grad_accum: int) -> float:
    """A lower bound on one optimizer step's seconds: `grad_accum` micro-steps, each at least its FLOPs at
    `PEAK_FLOPS` and at least `MIN_MICRO_STEP_S`."""
    micro = max(MIN_MICRO_STEP_S, 6 * n_params * batch_size * seq_len / PEAK_FLOPS)
    return grad_accum * micro


def gib(n: int | float) -> str:
    """Bytes as '1,234.5 GiB'."""
    return f"{n / 2**30:,.1f} GiB"
