"""Perplexity at and beyond the training length (`posenc eval-extrapolate`).

Two protocols (see the ALiBi paper, Press et al. 2022, §4 and App. B, and HF's perplexity guide):

- nonoverlap: the held-out token stream is cut into windows of L tokens; every token of every window is scored.
- sliding (stride S): windows of L tokens advance by S; only the last S tokens of each window are scored, so every
  scored token sees at least L - S tokens of context. S = L is exactly the non-overlapping protocol.
- fixed-target (target N): the NoPE paper's protocol (Kazemnejad et al. 2023, App. F). The same N tokens are scored
  at every length L: each window ends with its N target tokens and holds L - N tokens of context before them, so
  only the context grows with L. Separates "more context helps" from "positions past the training length break
  the model", which non-overlapping windows mix. The targets are consecutive N-token blocks at the END of the
  validation stream (the only anchoring that needs no knowledge of the other lengths asked for); a length whose
  windows do not all fit, or that is shorter than N, is n/a. N defaults to the base length (the NoPE paper scored
  the last ≤ 200 tokens at L = 1024; N = L/5 would cost five times more forwards per scored token here).
- streaming (window W, sinks N, block S = stride, default 1): StreamingLLM's KV-cache decoding over streams of L
  tokens (the nonoverlap protocol's windows), each token seeing the stream's first N tokens and its W (to W+S-1)
  most recent ones, their K/V as first computed, at positions assigned inside that cache; exact semantics in
  `posenc_cli.evaluation.streaming`. W defaults to the base length - N - S + 1, so the cache's positions stay below
  the base length.

Metrics are token-weighted: ppl = exp(total NLL / scored tokens), bits per byte = total NLL / (ln 2 · UTF-8 bytes of
the scored tokens). Windows are always taken from the start of the validation stream, so every run with the same
tokenizer scores exactly the same tokens (paired numbers), and for the non-overlapping protocol every length scores
the same stretch of text.

The validation stream is the run's own validation split, or another corpus given as data overrides
(`corpus.data_config_with_overrides`): files named with `data=text 'data.paths=[held_out.txt]'` are scored whole (an
evaluation-only corpus), not split. A length with no window in the stream is "too_few_tokens", a state of its own
apart from "n/a" (the scheme cannot read that many tokens; `results` lists every state). A run trained with
randomized positions is fed per-window sorted draws from its range (`positions`), unless sequential ids are asked for.


Results live in `eval/extrapolate.json` inside each run directory (`posenc_cli.evaluation.results` reads and writes
it); a new measurement replaces the entry with the same key (`entry_key`) and keeps the others.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from posenc_cli import __version__
from posenc_cli.config import DataConfig, EvalConfig
from posenc_cli.errors import CheckpointError, ConfigError, LengthBeyondScheme, UserError
from posenc_cli.evaluation.corpus import CorpusCache, check_held_out, data_config_with_overrides, data_name
from posenc_cli.evaluation.loop import Entry, measure, results_header
from posenc_cli.evaluation.positions import Positions, resolve_positions
from posenc_cli.evaluation.results import (
    BEYOND_SCHEME,
    NON_FINITE,
    OK,
    SEQUENTIAL,
    SHORTER_THAN_TARGET,
    TOO_FEW_TOKENS,
    Protocol,
    checkpoint_identity,
    entry_key,
    results_path,
    window_scores,
)
from posenc_cli.evaluation.runs import checked_runs, find_runs, locate_runs, named_error
from posenc_cli.evaluation.streaming import DEFAULT_BLOCK, STREAMING_DECODE, default_window, evaluate_streaming
from posenc_cli.run.device import cpu_has_fast_bf16, describe_device, resolve_device
from posenc_cli.run.device import threads as use_threads
from posenc_cli.run.hf_run import is_hf_dir, load_hf_run
from posenc_cli.run.interrupts import run_is_locked
from posenc_cli.run.load import load_run

if TYPE_CHECKING:
    from posenc_cli.data.cache import Corpus
    from posenc_cli.run.load import LoadedRun

Progress = Callable[[str, int, int], None]  # (description, done, total)

__all__ = [
    "CorpusCache",
    "ExtrapolateEntry",
    "check_not_training",
    "checked_runs",
    "data_config_with_overrides",
    "evaluate_each_run",
    "evaluate_model",
    "evaluate_paths",
    "evaluate_run",
    "evaluate_run_dir",
    "find_runs",
    "locate_runs",
    "plan_lengths",
    "plan_windows",
    "resolve_dtype",
    "resolve_stride",
]


# ----------------------------------------------------------------------------------------------------------------
# Pure planning: which lengths, which windows.


def plan_lengths(cfg: EvalConfig, base_length: int) -> list[tuple[int, float]]:
    """(length, multiple of `base_length`) pairs in increasing length, duplicates dropped."""
    if cfg.abs_lengths is not None:
        pairs = [(int(n), int(n) / base_length) for n in cfg.abs_lengths]
    else:
        pairs = [(max(1, round(m * base_length)), float(m)) for m in cfg.lengths]
    seen: dict[int, float] = {}
    for length, multiple in pairs:
        seen.setdefault(length, round(multiple, 6))
    return sorted(seen.items())


def resolve_stride(protocol: Protocol, stride: int | None, length: int, base_length: int | None = None) -> int:
    """Scored tokens per window: L for nonoverlap; `stride` (default L/2, at most L) for sliding; for fixed-target
    the target size `stride` (default `base_length`, else L; not capped, a target longer than L fits no window);
    for streaming the block size (default `streaming.DEFAULT_BLOCK`)."""
    if protocol == "nonoverlap":
        return length
    if protocol == "streaming":
        return max(1, int(stride or DEFAULT_BLOCK))
    if protocol == "fixed-target":
        return max(1, int(stride if stride is not None else (base_length or length)))
    if stride is None:
        return max(1, length // 2)
    return max(1, min(int(stride), length))


def plan_fixed_target(n_stream: int, length: int, target: int, n_tokens: int) -> np.ndarray:
    """Start offsets of fixed-target windows, (n_windows,) int64, ascending; empty unless all of them fit.

    Window k predicts stream tokens e_k - L + 1..e_k and scores its last `target`, e_k = n_stream - 1 - k·target
    (k = 0..⌈n_tokens/target⌉ - 1): the scored tokens depend on the stream, target and n_tokens only, never on L.
    """
    n = max(1, math.ceil(n_tokens / target))
    ends = n_stream - 1 - target * np.arange(n - 1, -1, -1, dtype=np.int64)  # (n,) last predicted token
    starts = ends - length
    if target > length or len(starts) == 0 or starts[0] < 0:
        return np.zeros(0, dtype=np.int64)
    return starts


def no_window_status(protocol: Protocol, length: int, stride: int) -> str:
    """The state of a cell without a window: shorter than its fixed target, else a corpus too short for it."""
    return SHORTER_THAN_TARGET if protocol == "fixed-target" and stride > length else TOO_FEW_TOKENS


def no_window_reason(protocol: Protocol, n_stream: int, length: int, stride: int, n_tokens: int) -> str:
    """Why `plan_windows` found no window (the `reason` of a too_few_tokens or shorter_than_target entry)."""
    if protocol != "fixed-target":
        what = "stream" if protocol == "streaming" else "window"
        return f"validation split has {n_stream} tokens; one {what} needs {length + 1}"
    if stride > length:
        return f"shorter than the fixed target of {stride} tokens"
    need = length + 1 + stride * (max(1, math.ceil(n_tokens / stride)) - 1)
    return f"validation split has {n_stream} tokens; fixed-target windows of {length} need {need}"


def plan_windows(
    n_stream: int, length: int, stride: int, n_tokens: int, protocol: Protocol = "nonoverlap"
) -> np.ndarray:
    """Start offsets of the evaluation windows, (n_windows,) int64 (`plan_fixed_target` for fixed-target).

    A window at s reads inputs s..s+L-1 and predicts s+1..s+L, so it needs s + L + 1 <= n_stream. Windows advance
    by `stride` and each scores `stride` tokens; enough windows are taken to score at least `n_tokens` tokens
    (rounded up to whole windows), or as many as the stream holds. Empty when not even one window fits.
    """
    if protocol == "fixed-target":
        return plan_fixed_target(n_stream, length, stride, n_tokens)
    if protocol == "streaming":  # streams are the nonoverlap windows; `stride` is the block size inside each
        return plan_windows(n_stream, length, length, n_tokens)
    if n_stream < length + 1:
        return np.zeros(0, dtype=np.int64)
    available = (n_stream - length - 1) // stride + 1
    wanted = max(1, math.ceil(n_tokens / stride))
    return np.arange(min(available, wanted), dtype=np.int64) * stride


def resolve_dtype(dtype: str, precision: str, device: torch.device | None = None) -> str:
    """'auto' -> 'bf16' when the run trained in bf16 (`precision`, from its meta.json), else 'fp32'.

    Exception: on a CPU without fast bf16 matmuls (see `device.cpu_has_fast_bf16`; emulated bf16 can be tens of
    times slower) 'auto' evaluates a bf16-trained run in fp32. The entry records the dtype actually used.
    """
    if dtype == "auto":
        if precision != "bf16":
            return "fp32"
        if device is not None and device.type == "cpu":
            return "bf16" if cpu_has_fast_bf16() else "fp32"
        return "bf16"
    if dtype not in ("fp32", "bf16"):
        raise ConfigError(f"--dtype must be auto, fp32 or bf16, got {dtype!r}")
    return dtype


# ----------------------------------------------------------------------------------------------------------------
# The measurement itself.


def evaluate_model(
    model: nn.Module,
    tokens: np.ndarray,
    token_bytes: np.ndarray | None,
    *,
    length: int,
    protocol: Protocol = "nonoverlap",
    stride: int | None = None,
    n_tokens: int = 16384,
    batch_tokens: int = 16384,
    dtype: str = "fp32",
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    positions: Positions | None = None,
) -> dict[str, Any]:
    """Score `model` ((B, T) int64 -> (B, T, V) logits) on windows of `tokens` (1-D ids).

    Returns {"tokens", "windows", "stride", "nll", "ppl", "bpb", "bytes", "per_position"}; `per_position[i]` is the
    mean NLL at window position L - S + i (all L positions for nonoverlap; the S target tokens for fixed-target,
    where `stride` is the target size). Raises `LengthBeyondScheme` when the model cannot serve `length` (checked
    before any forward when the model exposes `scheme.max_length`) and ValueError when no window fits. `positions`
    random: every window is fed its own sorted draw from [0, M) as `position_ids` (`positions.Positions`), else
    the model's default 0..L-1.
    """
    S = resolve_stride(protocol, stride, length)
    starts = plan_windows(len(tokens), length, S, n_tokens, protocol)
    if len(starts) == 0:
        raise ValueError(no_window_reason(protocol, len(tokens), length, S, n_tokens))
    if positions is not None and positions.beyond_range(length):
        raise ValueError(positions.beyond_range(length))
    generator = positions.generator(length) if positions is not None and positions.random else None
    scheme = getattr(model, "scheme", None)
    limit = getattr(scheme, "max_length", None)
    if limit is not None and length > limit:
        raise LengthBeyondScheme(getattr(scheme, "name", type(scheme).__name__), limit, length)

    device = torch.device(device)
    use_bf16 = dtype == "bf16"
    per_batch = max(1, batch_tokens // length)
    offsets = np.arange(length + 1, dtype=np.int64)
    pos_sum = torch.zeros(S, dtype=torch.float64)
    n_bytes = 0
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for i in range(0, len(starts), per_batch):
                idx = starts[i : i + per_batch, None] + offsets  # (B, L+1) stream positions
                window = np.asarray(tokens[idx], dtype=np.int64)  # (B, L+1)
                batch = torch.from_numpy(window).to(device)
                x, y = batch[:, :-1], batch[:, -S:]  # (B, L) inputs, (B, S) scored targets
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
                    if generator is None:
                        logits = model(x)  # (B, L, V)
                    else:  # one sorted draw from [0, M) per window, in window order
                        ids = positions.draw(len(x), length, generator).to(device)  # type: ignore[union-attr]
                        logits = model(x, position_ids=ids)  # (B, L, V)
                scored = logits[:, -S:, :].float()  # (B, S, V): log-softmax in fp32
                loss = F.cross_entropy(scored.reshape(-1, scored.size(-1)), y.reshape(-1), reduction="none")
                pos_sum += loss.view(-1, S).double().sum(0).cpu()
                if token_bytes is not None:
                    n_bytes += int(np.asarray(token_bytes)[window[:, -S:]].sum())
                if progress is not None:
                    progress(f"L={length}", min(i + per_batch, len(starts)), len(starts))
    finally:
        model.train(was_training)

    return window_scores(pos_sum, len(starts), S, n_bytes)


# ----------------------------------------------------------------------------------------------------------------
# Runs and data.


# ----------------------------------------------------------------------------------------------------------------
# Evaluating runs.


def evaluate_run(
    run: LoadedRun,
    cfg: EvalConfig,
    *,
    data: DataConfig | None = None,
    corpus: Corpus | None = None,
    corpora: CorpusCache | None = None,
    device: str | torch.device | None = None,
    force: bool | None = None,
    progress: Progress | None = None,
    store: bool = True,
    positions: str | None = None,
    positions_seed: int = 0,
) -> dict[str, Any]:
    """Measure (or reuse) every length of `cfg` for a loaded run and store the entries in its results file.

    Scores the run's own validation split unless `data` (another data config, tokenized with the run's tokenizer)
    or a ready `corpus` is given. Returns the results doc restricted to this call's entries, in length order, plus
    "path", "reused" (how many entries came from the file without a forward) and "not_saved" (None, or why the
    results file could not be written, e.g. read-only storage: the scores are returned all the same). `store=False`
    writes nothing into the run (`extend --eval` scoring the source run it must not modify). Entries are keyed by the
    checkpoint they measured, and a run being trained right now is refused (`check_not_training`). One cell per
    length, through the shared loop `loop.measure`.

    `positions` (None: the run's own, see `run_positions`): "random" feeds each window a sorted draw from [0, M) of
    a run trained with `train.random_positions=M` (seeded by `positions_seed`), "sequential" 0..T-1.
    """
    cfg.validate()
    position_ids = run_positions(run, cfg, positions, positions_seed)
    check_not_training(run.path)
    force = cfg.force if force is None else force
    device = torch.device(device) if device is not None else next(run.model.parameters()).device
    train_length, base_length = run.meta.lengths(run.config)
    dtype = resolve_dtype(cfg.dtype, run.meta.precision, device)

    data_cfg = data if data is not None else run.config.data
    check_held_out(data_cfg, run.config.data, run.path)
    if corpus is None:
        corpus = (corpora or CorpusCache()).get(data_cfg, run)
    stream = corpus.val
    fingerprint = str(corpus.info.get("fingerprint") or "")
    data_info = {"name": data_name(data_cfg), "fingerprint": fingerprint}
    checkpoint = checkpoint_identity(run.meta)
    described_device = describe_device(device)  # results depend on precision and hardware: record both

    streaming = streaming_settings(cfg, base_length)

    def plan() -> Iterator[list[ExtrapolateEntry]]:
        for length, multiple in plan_lengths(cfg, base_length):
            wanted = cfg.target if cfg.protocol == "fixed-target" else cfg.stride
            stride = resolve_stride(cfg.protocol, wanted, length, base_length)
            n_windows = len(plan_windows(len(stream), length, stride, cfg.tokens, cfg.protocol))
            kind = ExtrapolateEntry if streaming is None else partial(StreamingEntry, **streaming)
            yield [
                kind(
                    protocol=cfg.protocol,
                    stride=stride if cfg.protocol != "nonoverlap" else None,  # fixed-target: the target size
                    length=length,
                    multiple=multiple,
                    tokens=n_windows * (length if streaming is not None else stride),
                    dtype=dtype,
                    data=dict(data_info),
                    positions=position_ids.to_json(),
                    created=_now(),
                    checkpoint=dict(checkpoint),
                    device=described_device,
                )
            ]

    def measure_cell(group: Sequence[ExtrapolateEntry]) -> list[ExtrapolateEntry]:
        (entry,) = group
        length, stride = entry.length, resolve_stride(cfg.protocol, entry.stride, entry.length, base_length)
        if entry.tokens == 0:
            reason = no_window_reason(cfg.protocol, len(stream), length, stride, cfg.tokens)
            return [replace(entry, status=no_window_status(cfg.protocol, length, stride), reason=reason)]
        if position_ids.beyond_range(length):  # T distinct ids from [0, M) need T <= M
            return [replace(entry, status=BEYOND_SCHEME, reason=position_ids.beyond_range(length))]
        try:
            if streaming is not None:
                result = evaluate_streaming(
                    run.model,
                    stream,
                    run.tokenizer.token_bytes,
                    length=length,
                    block=stride,
                    n_tokens=cfg.tokens,
                    batch_tokens=cfg.batch_tokens,
                    dtype=dtype,
                    device=device,
                    progress=progress,
                    **streaming,
                )
                return [_filled(entry, result)]
            result = evaluate_model(
                run.model,
                stream,
                run.tokenizer.token_bytes,
                length=length,
                protocol=cfg.protocol,
                stride=stride,
                n_tokens=cfg.tokens,
                batch_tokens=cfg.batch_tokens,
                dtype=dtype,
                device=device,
                progress=progress,
                positions=position_ids,
            )
        except LengthBeyondScheme as e:  # same reason text at every length, so tables can group it
            return [replace(entry, status=BEYOND_SCHEME, reason=e.reason)]
        return [_filled(entry, result)]

    header = results_header(run.path.name, str(run.config.pos.name), train_length, base_length)
    done = measure(
        results_path(run.path),
        "eval-extrapolate",
        header,
        checkpoint,
        plan(),
        measure_cell,
        key=entry_key,
        force=force,
        store=store,
    )
    out = dict(done.header)
    out.update(path=str(run.path), reused=done.reused, entries=done.entries, not_saved=done.not_saved)
    return out


def run_positions(run: LoadedRun, cfg: EvalConfig, requested: str | None, seed: int = 0) -> Positions:
    """The position ids to feed `run` (`positions.resolve_positions` on its `train.random_positions`).

    The streaming protocol assigns positions inside its cache (`streaming`), so it is always sequential there, and
    asking for random with it is a `ConfigError`.
    """
    return config_positions(run.config, run.path, cfg, requested, seed)


def config_positions(config: Any, path: Path, cfg: EvalConfig, requested: str | None, seed: int = 0) -> Positions:
    """`run_positions` from a run's config alone (checked before the run is loaded)."""
    train = getattr(config, "train", None)
    random_range = int(getattr(train, "random_positions", 0) or 0)
    if cfg.protocol == "streaming":
        if requested == "random":
            raise ConfigError("--positions random does not apply to --protocol streaming (positions are the cache's)")
        return Positions()
    return resolve_positions(requested, random_range, seed, run=str(path))


def check_not_training(run_dir: Path) -> None:
    """Refuse to evaluate a run whose trainer holds its run lock: its weights are about to change.

    A stopped run (interrupted, or trained to its last step) is evaluated as it stands; its cells are keyed by that
    checkpoint, so training it further makes them stale (measured again) instead of wrong.
    """
    if run_is_locked(run_dir):
        raise CheckpointError(f"{run_dir} is being trained by another process; evaluate it once training has stopped")


@dataclass(frozen=True, kw_only=True)
class ExtrapolateEntry(Entry):
    """One length of `eval/extrapolate.json`; the fields in the order of the stored keys. `stride` is None for
    nonoverlap, the target size for fixed-target; `tokens` the scored tokens (0: no window fits); `data` the corpus
    {name, fingerprint}; `positions` the position ids fed (`Positions.to_json`); `status` one of
    `results.CellStatus`."""

    protocol: str
    stride: int | None
    length: int
    multiple: float
    tokens: int
    dtype: str
    data: dict[str, str]
    positions: dict[str, Any] = field(default_factory=lambda: dict(SEQUENTIAL))
    status: str = BEYOND_SCHEME  # planned; measuring sets the state (`results.CellStatus`)
    reason: str | None = None
    ppl: float | None = None
    nll: float | None = None
    bpb: float | None = None
    per_position: list[float] = field(default_factory=list)
    posenc_version: str = __version__
    created: str
    checkpoint: dict[str, Any]
    device: str


@dataclass(frozen=True, kw_only=True)
class StreamingEntry(ExtrapolateEntry):
    """An entry of the streaming protocol: `stride` is the block size, `tokens` every token of the streams, and the
    cache's recent `window` and `sinks` (part of the entry's key) follow the other fields. `decode` (in the key too)
    says how the cache was read: "kv-cache", StreamingLLM's K/V kept as first computed (`evaluation.streaming`);
    entries without it were measured by re-encoding the kept tokens per block and are measured again."""

    window: int
    sinks: int
    decode: str = STREAMING_DECODE


def streaming_settings(cfg: EvalConfig, base_length: int) -> dict[str, int] | None:
    """{"window", "sinks"} of the streaming protocol (window default: base length minus sinks, at least 1); None
    for the other protocols."""
    if cfg.protocol != "streaming":
        return None
    block = resolve_stride("streaming", cfg.stride, base_length)
    window = cfg.window if cfg.window is not None else default_window(base_length, cfg.sinks, block)
    return {"window": int(window), "sinks": int(cfg.sinks)}


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _filled(entry: ExtrapolateEntry, result: dict[str, Any]) -> ExtrapolateEntry:
    nll = result["nll"]
    if not math.isfinite(nll) or not math.isfinite(result["ppl"]):
        reason = f"non-finite loss (mean NLL {nll})"
        return replace(entry, status=NON_FINITE, reason=reason, nll=nll if math.isfinite(nll) else None)
    return replace(
        entry,
        status=OK,
        tokens=result["tokens"],
        ppl=result["ppl"],
        nll=nll,
        bpb=result["bpb"],
        per_position=[round(v, 6) for v in result["per_position"]],
    )


def evaluate_each_run(
    run_dirs: Sequence[Path | str],
    evaluate: Callable[[LoadedRun, torch.device], dict[str, Any]],
    *,
    device: str | torch.device = "auto",
    threads: int = 0,
    on_run: Callable[[Path, int, int], None] | None = None,
    skippable: Iterable[Path] = (),
    on_skip: Callable[[Path, str], None] | None = None,
) -> list[dict[str, Any]]:
    """Load each run directory in turn (one model in memory at a time) and collect `evaluate(run, device)`.

    A run of `skippable` (found by a search, not named) that fails to load is left out with `on_skip(run, why)`;
    any other failure to load raises, naming the run.
    """
    device = resolve_device(device)
    may_skip = {Path(p).resolve() for p in skippable}
    results = []
    with use_threads(threads):
        for i, path in enumerate(run_dirs):
            if on_run is not None:
                on_run(Path(path), i, len(run_dirs))
            try:
                run = load_hf_run(path, device=device) if is_hf_dir(path) else load_run(path, device=device)
            except UserError as e:
                if Path(path).resolve() not in may_skip or on_skip is None:
                    raise named_error(Path(path), e) from e
                on_skip(Path(path), str(named_error(Path(path), e)))
                continue
            results.append(evaluate(run, device))
            del run
    return results


def _run_evaluator(
    cfg: EvalConfig,
    data_overrides: Sequence[str],
    force: bool | None,
    progress: Progress | None,
    corpora: CorpusCache | None,
    store: bool = True,
    positions: str | None = None,
    positions_seed: int = 0,
) -> Callable[[LoadedRun, torch.device], dict[str, Any]]:
    """`evaluate_run` with these settings, on each run's data config composed with `data_overrides`."""

    def evaluate(run: LoadedRun, device: torch.device) -> dict[str, Any]:
        data = data_config_with_overrides(run.config.data, data_overrides) if data_overrides else None
        return evaluate_run(
            run,
            cfg,
            data=data,
            corpora=corpora,
            device=device,
            force=force,
            progress=progress,
            store=store,
            positions=positions,
            positions_seed=positions_seed,
        )

    return evaluate


def evaluate_run_dir(
    run_dir: Path | str,
    cfg: EvalConfig,
    *,
    data_overrides: Sequence[str] = (),
    device: str | torch.device = "auto",
    threads: int = 0,
    force: bool | None = None,
    progress: Progress | None = None,
    corpora: CorpusCache | None = None,
    store: bool = True,
    positions: str | None = None,
    positions_seed: int = 0,
) -> dict[str, Any]:
    """Load one run directory and `evaluate_run` it (data overrides compose only the data group)."""
    evaluate = _run_evaluator(cfg, data_overrides, force, progress, corpora, store, positions, positions_seed)
    (result,) = evaluate_each_run([run_dir], evaluate, device=device, threads=threads)
    return result


def evaluate_paths(
    paths: Sequence[Path | str],
    cfg: EvalConfig,
    *,
    data_overrides: Sequence[str] = (),
    device: str | torch.device = "auto",
    threads: int = 0,
    force: bool | None = None,
    progress: Progress | None = None,
    on_run: Callable[[Path, int, int], None] | None = None,
    on_skip: Callable[[Path, str], None] | None = None,
    positions: str | None = None,
    positions_seed: int = 0,
) -> list[dict[str, Any]]:
    """Find the runs below `paths`, check them all and the settings against each (`runs.checked_runs`), then
    evaluate each in turn (one model in memory at a time). Without `on_skip` a run that cannot be read is an error,
    wherever it came from."""
    cfg.validate()

    def check(config: Any, path: Path) -> None:  # the settings must fit every run before any is measured
        config_positions(config, path, cfg, positions)
        if data_overrides:
            check_held_out(data_config_with_overrides(config.data, data_overrides), config.data, path)

    runs, searched = checked_runs(paths, check=check, on_skip=on_skip)
    evaluate = _run_evaluator(
        cfg, data_overrides, force, progress, CorpusCache(), positions=positions, positions_seed=positions_seed
    )
    return evaluate_each_run(
        runs, evaluate, device=device, threads=threads, on_run=on_run, skippable=searched, on_skip=on_skip
    )
