"""`train.compile`: torch.compile of the model's training steps, checked before a run starts.

What is compiled is the model's forward (and, through AOTAutograd, its backward); the loss, the optimizer step and
validation stay eager, so a compiled run's validation losses are computed exactly as an eager run's. Modes are
torch.compile's own (`torch.compile(mode=...)`, PyTorch docs "torch.compile"): `true` is "default"; "reduce-overhead"
records CUDA graphs on a GPU, which removes the per-kernel launch cost that dominates the steps of small models there
(on a CPU it compiles as "default": there are no CUDA graphs to record).

TorchInductor generates C++ on a CPU and Triton kernels on CUDA, so it needs a C++ compiler (`$CXX`, else g++;
the search of torch/_inductor/config.py `cpp.cxx`) and, on CUDA, the triton package. Without them
`check_compile` refuses the run in one line before anything is written. The first step compiles (seconds on a
CPU, up to a minute on a GPU); `warm_up` takes it before the run's clock starts, on a dummy batch and with every
random stream restored, so the trained numbers are those of the first real step.

Graph breaks: the model's forward, the per-layer views included, traces as one graph (tests/model/test_model.py,
`fullgraph=True`); `TORCH_LOGS=graph_breaks` lists any that a new scheme brings.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Callable

import torch
from torch import Tensor, nn

from posenc_cli.errors import ConfigError

# The backend torch.compile uses (tests set Dynamo's "eager" or "aot_eager": the same tracing, no code generation).
BACKEND = "inductor"
_CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile's modes that record CUDA graphs


def compile_mode(value: bool | str) -> str | None:
    """torch.compile's mode for `train.compile` (None: eager)."""
    if value is False:
        return None
    return "default" if value is True else str(value)


def describe(value: bool | str) -> str:
    """'eager' or 'compiled (<mode>)': how a run's steps execute, for its start line."""
    mode = compile_mode(value)
    return "eager" if mode is None else f"compiled ({mode})"


def cxx_compiler() -> str | None:
    """The C++ compiler TorchInductor would use here (its default search: `$CXX`, else g++/clang++), or None."""
    name = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")
    return shutil.which(name)


def has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def check_compile(value: bool | str, device: torch.device) -> None:
    """`ConfigError` (one line, before anything is written) when `train.compile` cannot work on `device` here."""
    mode = compile_mode(value)
    if mode is None or BACKEND != "inductor":
        return
    setting = _setting(value)
    if cxx_compiler() is None:
        raise ConfigError(
            f"{setting} needs a C++ compiler for TorchInductor, and none was found ($CXX or "
            f"{'clang++' if sys.platform == 'darwin' else 'g++'}); install one, or train with train.compile=false"
        )
    if device.type == "cuda" and not has_triton():
        raise ConfigError(f"{setting} on CUDA needs the triton package (pip install triton), or train.compile=false")


def _setting(value: bool | str) -> str:
    return f"train.compile={str(value).lower() if isinstance(value, bool) else value}"


def compile_model(model: nn.Module, value: bool | str, threads: int = 0) -> nn.Module:
    """`model` compiled with `train.compile`'s mode (the module itself when eager). Its parameters stay the
    module's own, so the optimizer, checkpoints and the eager `model` used for validation share them.

    Dynamo's caches are cleared first: a process that trains several models in turn (a sweep's jobs under the basic
    launcher) would otherwise reach its recompilation limit and fall back to eager without saying so. `threads`
    (> 0) caps Inductor's parallel compile workers, as the job's share of the cores caps its own threads.
    """
    mode = compile_mode(value)
    if mode is None:
        return model
    torch._dynamo.reset()
    if threads > 0:
        import torch._inductor.config as inductor_config  # deferred: only a compiled run needs Inductor

        inductor_config.compile_threads = threads
    return torch.compile(model, mode=mode, backend=BACKEND)  # type: ignore[return-value]


def _reason(e: BaseException) -> str:
    """The compiler's own error in one line: a backend failure wraps it (`inner_exception`)."""
    inner = getattr(e, "inner_exception", None) or e
    first = next((line.strip() for line in str(inner).splitlines() if line.strip()), "")
    return f"{type(inner).__name__}: {first}"[:240] if first else type(inner).__name__


def uses_cuda_graphs(value: bool | str, device: torch.device) -> bool:
    return device.type == "cuda" and compile_mode(value) in _CUDA_GRAPH_MODES


def step_begin(value: bool | str, device: torch.device) -> None:
    """Before each optimizer step: a new CUDA-graph iteration (torch.compiler.cudagraph_mark_step_begin), whose
    memory may overwrite the previous step's outputs, all consumed by then (the gradients were applied and cleared).
    Once per step, not per micro-batch: the micro-batches' gradients accumulate across the step's forwards."""
    if uses_cuda_graphs(value, device):
        torch.compiler.cudagraph_mark_step_begin()


def warm_up(forward: Callable[[], Tensor], params: list[nn.Parameter], device: torch.device, value: bool | str) -> None:
    """Compile now: one forward and backward of `forward()` (the model on a dummy batch), then every gradient
    cleared and every random stream as it was; a compiler failure is a one-line `ConfigError`."""
    if compile_mode(value) is None:
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        try:
            for _ in range(3 if uses_cuda_graphs(value, device) else 1):  # CUDA graphs record on a later call
                step_begin(value, device)
                forward().float().sum().backward()
        except torch._dynamo.exc.TorchDynamoException as e:
            raise ConfigError(
                f"{_setting(value)}: torch.compile failed on this machine ({_reason(e)}); train with "
                "train.compile=false"
            ) from e
        finally:
            for p in params:
                p.grad = None


__all__ = ["check_compile", "compile_mode", "compile_model", "describe", "step_begin", "warm_up"]
