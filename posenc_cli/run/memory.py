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
            f"{_gib(need)} of memory and {_gib(available)} is available"
        )


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def planned_vocab_size(cfg: Config) -> int:
    """The vocabulary a run of `cfg` will have, known before its tokenizer is built (bytes: 256 + end-of-document)."""
    return 257 if cfg.tokenizer.kind == "byte" else cfg.tokenizer.vocab_size
