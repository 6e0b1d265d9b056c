"""Measurements behind `posenc bench`: training throughput against `transformers`' Llama, the machine's matmul peak,
model FLOPs utilisation, and evaluation speed and peak memory at long lengths (one subprocess per case).

Training cases run in one process in interleaved rounds (posenc, Llama, matmul probe; then probe, Llama, posenc; ...),
so slow drifts of a shared machine's load hit every case alike; each reports the median over rounds. Paired figures
(the median over rounds of posenc/Llama and of MFU against the same round's probe) are reported next to them: on a
machine whose speed drifts they are the steadier estimate. A training step is
what `posenc train` does: forward under the run's precision, cross-entropy, backward, gradient clipping, AdamW step.

Model FLOPs per trained token (MFU numerator), for N parameters counted once and a causal context of T tokens:

    flops/token = 6·N + 6·n_layer·d_model·T

6·N is the forward (2·N) and backward (4·N) of every weight matmul (Kaplan et al. 2020; PaLM, Chowdhery et al. 2022,
App. B); the tied embedding counts once, as the output projection it is. Attention adds, per layer and token, 2·d·T
for q·kᵀ and 2·d·T for probabilities·v in the forward pass over the full square; the causal triangle halves that, and
the backward doubles it again: 6·d·T (PaLM's 12·L·d·T counts the full square). MFU divides the achieved model
FLOP/s by the dtype's own measured peak: the best large square matmul of the same dtype on the same device.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc_cli.bounds import MAX_SECONDS, check
from posenc_cli.config import Config, ModelConfig, TrainConfig
from posenc_cli.data.tokenizer import BYTE_VOCAB_SIZE
from posenc_cli.errors import ConfigError, UserError
from posenc_cli.model import GPT, build_model
from posenc_cli.positional import config_class
from posenc_cli.run.device import autocast, cpu_has_fast_bf16, resolve_device, resolve_precision, threads
from posenc_cli.run.optim import build_optimizer

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}
FLOPS_FORMULA = "6*N + 6*n_layer*d_model*T  (N: parameters counted once; causal attention)"
HF_DIFFERENCES = (
    "Llama: same width, layers, heads (no GQA), vocab and tied embeddings; SiLU-gated MLP with "
    "i = round(2*mlp_ratio*d/3) (equal parameters up to rounding), RMSNorm, no biases, RoPE built in; "
    "posenc: GELU MLP, LayerNorm, biases when model.bias=true, the configured pos scheme"
)
Progress = Callable[[str], None]


# ----------------------------------------------------------------------------------------------------------------
# Small measuring tools.


def peak_rss_mib() -> float:
    """Peak resident memory of this process in MiB.

    Linux: VmHWM from /proc/self/status. `ru_maxrss` would also do, except that Linux carries the parent's resident
    size into a child's `ru_maxrss` across fork/vfork + exec, so a subprocess started by a large parent reports the
    parent's size as its floor. VmHWM belongs to the process's own address space, which exec replaces.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB elsewhere


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, repeats: int = 1) -> float:
    """Seconds for `repeats` calls of `fn`, with the device synchronised before and after."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    synchronize(device)
    return time.perf_counter() - start


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def interleaved_rounds(
    cases: dict[str, Callable[[], float]],
    rounds: int,
    progress: Progress | None = None,
    deadline: float | None = None,
) -> dict:
    """Call every case once per round, reversing the order every other round (A B C, C B A, A B C, ...), so no case
    always runs right after the same neighbour (e.g. after the matmul probe has heated the cores); returns each
    case's values in round order. No round starts after `deadline` (`time.monotonic()`), but the first."""
    values: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(rounds):
        if r > 0 and deadline is not None and time.monotonic() >= deadline:
            break
        for name in names if r % 2 == 0 else names[::-1]:
            case = cases[name]
            if progress:
                progress(f"round {r + 1}/{rounds}: {name}")
            values[name].append(case())
    return values


# ----------------------------------------------------------------------------------------------------------------
# Matmul peak.


def matmul_size(dtype: torch.dtype, device: torch.device, min_seconds: float = 0.2, max_size: int | None = None) -> int:
    """Side of the square matmul used as the peak probe: doubled from 256 until one product takes `min_seconds`
    (so the probe is compute-bound, not launch-bound) or reaches `max_size` (4096 on CPU, 8192 on GPUs)."""
    max_size = max_size or (4096 if device.type == "cpu" else 8192)
    n = 256
    while n < max_size:
        a, b = _square_pair(n, dtype, device)
        _product(a, b)  # warm-up (kernel selection, page faults)
        if timed(lambda a=a, b=b: _product(a, b), device) >= min_seconds:
            break
        n *= 2
    return n


def matmul_gflops(n: int, dtype: torch.dtype, device: torch.device, repeats: int = 3) -> float:
    """Best GFLOP/s (2·n³ FLOPs per product) of `repeats` n×n products a·bᵀ in `dtype`.

    a·bᵀ with both operands row-major is the layout of `nn.Linear` (x·Wᵀ), i.e. of the model's own matmuls; on CPUs
    that emulate bf16 it is also several times faster than a·b, which would understate the bf16 peak.
    """
    a, b = _square_pair(n, dtype, device)
    _product(a, b)
    inner = 1 if device.type == "cpu" else 10  # GPU products are short: time a few back to back
    best = min(timed(lambda: _product(a, b), device, inner) / inner for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _product(a: Tensor, b: Tensor) -> Tensor:
    return a @ b.t()


def _square_pair(n: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(n)
    return tuple(torch.randn(n, n, generator=g).to(device=device, dtype=dtype) for _ in range(2))  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------------------------
# FLOPs and the matching Llama.


def train_flops_per_token(n_params: int, n_layer: int, d_model: int, seq_len: int) -> int:
    """Model FLOPs per trained token: 6·N + 6·n_layer·d_model·T (see the module docstring)."""
    return 6 * n_params + 6 * n_layer * d_model * seq_len


def llama_intermediate_size(model: ModelConfig) -> int:
    """Llama's gated MLP has 3·d·i weights, posenc's MLP 2·mlp_ratio·d² (+ biases): i = round(2·mlp_ratio·d/3)."""
    return round(2 * model.mlp_ratio * model.d_model / 3)


def llama_config(model: ModelConfig, vocab_size: int, max_length: int) -> Any:
    """`transformers.LlamaConfig` with posenc's width, depth, heads, vocab and an equal-parameter MLP.

    Differences that remain by design of the two architectures: RMSNorm instead of LayerNorm, SiLU-gated MLP instead
    of GELU, no biases (posenc's `model.bias=true` adds 2·d + mlp_ratio·d + 3·d + d per layer), RoPE built in.
    """
    try:
        # deferred: keeps transformers off posenc --help start-up
        from transformers import LlamaConfig
    except ImportError as e:
        raise UserError("--vs hf needs the 'transformers' package (pip install transformers)") from e
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=model.d_model,
        intermediate_size=llama_intermediate_size(model),
        num_hidden_layers=model.n_layer,
        num_attention_heads=model.n_head,
        num_key_value_heads=model.n_head,
        max_position_embeddings=max_length,
        rms_norm_eps=1e-5,
        initializer_range=model.init_std,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        use_cache=False,
        attn_implementation="sdpa",
    )


def build_llama(model: ModelConfig, vocab_size: int, max_length: int) -> nn.Module:
    # deferred: keeps transformers off posenc --help start-up
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(llama_config(model, vocab_size, max_length))


def bench_vocab_size(cfg: Config) -> int:
    """The vocabulary `posenc train` would have: 257 for the byte tokenizer, else `tokenizer.vocab_size`."""
    return BYTE_VOCAB_SIZE if cfg.tokenizer.kind == "byte" else cfg.tokenizer.vocab_size


# ----------------------------------------------------------------------------------------------------------------
# Training throughput.


@dataclass
class TrainCase:
    """One model's training step on a fixed random batch, and what one step is worth."""

    step: Callable[[], None]
    tokens_per_step: int
    n_params: int
    flops_per_token: int


def train_case(
    model: nn.Module,
    logits: Callable[[Tensor], Tensor],
    tc: TrainConfig,
    vocab_size: int,
    device: torch.device,
    precision: str,
    flops_per_token: int,
) -> TrainCase:
    """A closure running one `posenc train` step (autocast forward, cross-entropy, backward, clip, AdamW)."""
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(model, tc, device)
    g = torch.Generator().manual_seed(tc.seed)
    x = torch.randint(0, vocab_size, (tc.batch_size, tc.seq_len), generator=g).to(device)
    y = torch.randint(0, vocab_size, (tc.batch_size, tc.seq_len), generator=g).to(device)

    def step() -> None:
        with autocast(device, precision):  # type: ignore[arg-type]
            out = logits(x)  # (B, T, V)
        loss = F.cross_entropy(out.float().reshape(-1, vocab_size), y.reshape(-1))
        loss.backward()
        if tc.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    n_params = sum(p.numel() for p in params)
    return TrainCase(step, tc.batch_size * tc.seq_len, n_params, flops_per_token)


def posenc_train_case(cfg: Config, vocab_size: int, device: torch.device, precision: str) -> TrainCase:
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg, vocab_size)
    m = cfg.model
    flops = train_flops_per_token(model.num_parameters(), m.n_layer, m.d_model, cfg.train.seq_len)
    return train_case(model, model, cfg.train, vocab_size, device, precision, flops)


def hf_train_case(cfg: Config, vocab_size: int, device: torch.device, precision: str) -> TrainCase:
    torch.manual_seed(cfg.train.seed)
    model = build_llama(cfg.model, vocab_size, cfg.train.seq_len)
    n = sum(p.numel() for p in model.parameters())  # tied weights are one Parameter: counted once
    m = cfg.model
    flops = train_flops_per_token(n, m.n_layer, m.d_model, cfg.train.seq_len)
    return train_case(model, lambda x: model(input_ids=x).logits, cfg.train, vocab_size, device, precision, flops)


def calibrated(case: TrainCase, device: torch.device, round_seconds: float, warmup: int) -> Callable[[], float]:
    """Warm the case up, pick steps per round so a round lasts about `round_seconds`; returns a tokens/s probe."""
    seconds = 0.0
    for _ in range(max(1, warmup)):
        seconds = timed(case.step, device)  # the last warm-up step sets the pace
    steps = max(1, round(round_seconds / max(seconds, 1e-9)))
    return lambda: steps * case.tokens_per_step / timed(case.step, device, steps)


# ----------------------------------------------------------------------------------------------------------------
# Evaluation cases, each in a fresh process.


@dataclass(kw_only=True)
class EvalCase:
    """One long-context forward: scheme, length, batch, precision, device and threads (JSON across processes)."""

    model: dict[str, Any]
    pos: str
    vocab_size: int
    train_length: int
    length: int
    batch: int
    precision: str
    device: str
    threads: int
    repeats: int = 2


def run_eval_case(case: EvalCase) -> dict[str, float]:
    """In this process: build the model, warm up on a short input, time `repeats` forwards under inference mode.

    Returns tokens_per_s (median over repeats), peak_mem_mb (VmHWM on CPU; max allocated on CUDA), base_mem_mb
    (the same measure just before the first full-length forward) and seconds (median forward time).
    """
    device = torch.device(case.device)
    if case.threads > 0:
        torch.set_num_threads(case.threads)
    torch.manual_seed(0)
    model = GPT(ModelConfig(**case.model), config_class(case.pos)(), case.vocab_size, case.train_length)
    model.to(device).eval()
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, case.vocab_size, (case.batch, case.length), generator=g).to(device)

    def forward(x: Tensor) -> None:
        with torch.inference_mode(), autocast(device, case.precision):  # type: ignore[arg-type]
            model(x)

    forward(idx[:1, : min(case.length, 64)])  # kernels and allocator warm, no full-length peak yet
    base = memory_mib(device, reset=True)
    times = [timed(lambda: forward(idx), device) for _ in range(max(1, case.repeats))]
    seconds = median(times)
    return {
        "tokens_per_s": case.batch * case.length / seconds,
        "peak_mem_mb": memory_mib(device),
        "base_mem_mb": base,
        "seconds": seconds,
    }


def memory_mib(device: torch.device, reset: bool = False) -> float:
    """Peak memory so far in MiB: the CUDA allocator's peak (`reset`: then start a new one), else the process's peak
    resident set (`peak_rss_mib`)."""
    if device.type == "cuda":
        value = torch.cuda.max_memory_allocated(device) / 2**20
        if reset:
            torch.cuda.reset_peak_memory_stats(device)
        return value
    return peak_rss_mib()


def die_with_parent() -> None:
    """In a child between fork and exec (`preexec_fn`): ask Linux to SIGKILL it when its parent dies
    (prctl(PR_SET_PDEATHSIG), prctl(2)), so a benchmark case never outlives a killed `posenc bench`. A no-op
    elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def spawn_eval_case(case: EvalCase, timeout: float | None = None) -> dict[str, float]:
    """Run `run_eval_case` in a fresh interpreter (peak memory is a per-process high-water mark), killed with its
    parent (`die_with_parent`) or past `timeout` seconds."""
    cmd = [sys.executable, "-m", "posenc_cli.perf.bench", "--eval-case", json.dumps(asdict(case))]
    env = {**os.environ, "OMP_NUM_THREADS": str(case.threads)} if case.threads > 0 else None
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, preexec_fn=die_with_parent)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"eval case {case.pos} at {case.length} tokens failed: {last}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------------------------
# The whole benchmark.


@dataclass(kw_only=True)
class BenchOptions:
    """What `posenc bench` measures. Lengths are multiples of `train.seq_len`; eval batches hold about
    `eval_tokens` tokens (default: the longest length, so every case processes the same number of tokens)."""

    rounds: int = 5
    dtypes: tuple[str, ...] = ("fp32", "bf16")
    vs_hf: bool = False
    train: bool = True
    eval: bool = True
    eval_schemes: tuple[str, ...] = ("nope", "rope", "alibi")
    eval_multiples: tuple[int, ...] = (1, 8, 32)
    eval_tokens: int | None = None
    round_seconds: float = 1.0
    matmul_max_size: int | None = None  # None: 4096 on CPU, 8192 on GPUs
    slow_rounds: int = 3  # rounds for a dtype this device emulates (bf16 on CPUs without bf16 instructions)
    time_budget_s: float | None = None  # wall time of the whole benchmark: nothing starts after it, a case is cut

    def validate(self) -> None:
        if self.time_budget_s is not None:
            check(self.time_budget_s, "--time-budget", 0.0, MAX_SECONDS)
        unknown = [d for d in self.dtypes if d not in DTYPES]
        if unknown or not self.dtypes:
            raise ConfigError(f"--dtypes: '{','.join(unknown)}' is not one of fp32, bf16")
        if self.rounds < 1:
            raise ConfigError("--rounds must be >= 1")
        if any(m < 1 for m in self.eval_multiples):
            raise ConfigError("eval length multiples must be >= 1")


def run_bench(cfg: Config, opts: BenchOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Measure everything `opts` asks for on the device and threads of `cfg.train`; returns the JSON-ready result."""
    opts.validate()
    cfg.validate()
    device = resolve_device(cfg.train.device)
    vocab = bench_vocab_size(cfg)
    say = progress or (lambda message: None)
    result: dict[str, Any] = {
        "device": _device_name(device),
        "torch": torch.__version__,
        "load_average_start": load_average(),
        "config": {
            **asdict(cfg.model),
            "pos": cfg.pos.name,
            "seq_len": cfg.train.seq_len,
            "batch_size": cfg.train.batch_size,
            "vocab_size": vocab,
        },
        "flops_per_token_formula": FLOPS_FORMULA,
    }
    if opts.vs_hf:
        result["hf_intermediate_size"] = llama_intermediate_size(cfg.model)
        result["hf_differences"] = HF_DIFFERENCES
    deadline = time.monotonic() + opts.time_budget_s if opts.time_budget_s else None
    with threads(cfg.train.threads) as n_threads:
        result["threads"] = n_threads if device.type == "cpu" else None
        for name in opts.dtypes:
            if deadline is not None and time.monotonic() >= deadline:
                result[name] = {"skipped": f"time budget ({opts.time_budget_s:g} s) spent"}
                continue
            try:
                precision = resolve_precision(name, device)
            except ConfigError as e:
                result[name] = {"skipped": str(e)}
                continue
            emulated = name == "bf16" and device.type == "cpu" and not cpu_has_fast_bf16()
            rounds = min(opts.rounds, opts.slow_rounds) if emulated else opts.rounds
            entry: dict[str, Any] = {"rounds": rounds, "emulated_on_this_cpu": emulated}
            if opts.train:
                entry.update(bench_training(cfg, opts, vocab, device, precision, rounds, say, deadline))
            if opts.eval:
                entry["eval"] = bench_eval(cfg, opts, vocab, device, precision, n_threads, say, deadline)
            result[name] = entry
    result["load_average_end"] = load_average()
    return result


def bench_training(
    cfg: Config,
    opts: BenchOptions,
    vocab: int,
    device: torch.device,
    precision: str,
    rounds: int,
    say: Progress,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Interleaved rounds of posenc training, Llama training (with `vs_hf`) and the matmul probe of `precision`."""
    dtype = DTYPES[precision]
    warmup = 1 if rounds < opts.rounds else 2
    say(f"{precision}: building models and warming up")
    posenc = posenc_train_case(cfg, vocab, device, precision)
    cases = {"posenc": calibrated(posenc, device, opts.round_seconds, warmup)}
    hf = None
    if opts.vs_hf:
        hf = hf_train_case(cfg, vocab, device, precision)
        cases["hf"] = calibrated(hf, device, opts.round_seconds, warmup)
    size = matmul_size(dtype, device, max_size=opts.matmul_max_size)
    cases["matmul"] = lambda: matmul_gflops(size, dtype, device, repeats=2)
    values = interleaved_rounds(cases, rounds, lambda m: say(f"{precision} training, {m}"), deadline)
    peak = max(values["matmul"])
    tps = median(values["posenc"])
    out: dict[str, Any] = {
        "posenc_tokens_per_s": tps,
        "hf_tokens_per_s": None,
        "ratio_vs_hf": None,
        "matmul_peak_gflops": peak,
        "matmul_size": size,
        "mfu": mfu(tps, posenc.flops_per_token, peak),
        "mfu_vs_same_round_probe": median(
            [mfu(t, posenc.flops_per_token, p) for t, p in zip(values["posenc"], values["matmul"], strict=True)]
        ),
        "posenc_flops_per_token": posenc.flops_per_token,
        "posenc_params": posenc.n_params,
        "samples": values,
    }
    if hf is not None:
        hf_tps = median(values["hf"])
        ratios = [a / b for a, b in zip(values["posenc"], values["hf"], strict=True)]
        out.update(
            hf_tokens_per_s=hf_tps,
            ratio_vs_hf=tps / hf_tps,
            ratio_vs_hf_same_round=median(ratios),
            hf_mfu=mfu(hf_tps, hf.flops_per_token, peak),
            hf_flops_per_token=hf.flops_per_token,
            hf_params=hf.n_params,
        )
    return out


def mfu(tokens_per_s: float, flops_per_token: int, peak_gflops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the measured peak."""
    return tokens_per_s * flops_per_token / (peak_gflops * 1e9) if peak_gflops > 0 else float("nan")


def eval_cases(cfg: Config, opts: BenchOptions, vocab: int, device: torch.device, precision: str, n_threads: int):
    """The (scheme, length) cases, grouped by length so the schemes at one length run back to back."""
    T = cfg.train.seq_len
    lengths = [T * m for m in opts.eval_multiples]
    budget = opts.eval_tokens or max(lengths)
    for length in lengths:
        for scheme in opts.eval_schemes:
            yield EvalCase(
                model=asdict(cfg.model),
                pos=scheme,
                vocab_size=vocab,
                train_length=T,
                length=length,
                batch=max(1, budget // length),
                precision=precision,
                device=str(device),
                threads=n_threads if device.type == "cpu" else 0,
                repeats=1 if precision == "bf16" and device.type == "cpu" else 2,
            )


def bench_eval(
    cfg: Config,
    opts: BenchOptions,
    vocab: int,
    device: torch.device,
    precision: str,
    n_threads: int,
    say: Progress,
    deadline: float | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """{scheme: {length: {tokens_per_s, peak_mem_mb, base_mem_mb, seconds, batch}}}; the cases left when the
    `deadline` (`time.monotonic()`) passes are not run, and one running then is stopped."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for case in eval_cases(cfg, opts, vocab, device, precision, n_threads):
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        say(f"{precision} eval: {case.pos} at {case.length} tokens (batch {case.batch})")
        try:
            r = spawn_eval_case(case, timeout=left)
        except subprocess.TimeoutExpired:
            break
        out.setdefault(case.pos, {})[str(case.length)] = {**r, "batch": case.batch}
    return out


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"

    return f"cpu ({platform.processor() or platform.machine()}, {torch.backends.cpu.get_cpu_capability()})"


def main(argv: list[str] | None = None) -> None:
    """`python -m posenc_cli.perf.bench --eval-case JSON`: one evaluation case, result as one JSON line on stdout."""
    parser = argparse.ArgumentParser(prog="python -m posenc_cli.perf.bench")
    parser.add_argument("--eval-case", required=True, help="EvalCase fields as JSON")
    args = parser.parse_args(argv)
    case = EvalCase(**json.loads(args.eval_case))
    print(json.dumps(run_eval_case(case)))


if __name__ == "__main__":
    main()
