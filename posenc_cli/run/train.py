"""Training: AdamW with warm-up + cosine decay, gradient accumulation and clipping, bf16 autocast, periodic
validation, atomic checkpoints, exact resume, graceful SIGTERM/SIGINT and non-finite guards.

`train()` never prints: it reports through `callback(event)` with dicts whose "event" is one of
  data        {stage, done, total}                 while the corpus is read/tokenized
  start       {run_dir, step, steps, resumed, device, precision, threads, compile ('eager' or 'compiled (<mode>)'),
               n_params, tokens_per_step (rows x length, padding included), tokens (input tokens before this
               session, padding not counted), seq_len}
  step        {step, steps, loss, lr, grad_norm, tokens, scored_tokens, tokens_per_s (session mean),
               interval_tokens_per_s (since the last logged step), elapsed_s, logged}       after every update
              (tokens: input tokens processed, padding not counted; scored_tokens: targets the loss counted;
               loss: mean NLL per scored target)
  eval        {step, val_loss, seconds}               seconds: how long it took (for profiling)
  checkpoint  {step, status, seconds}
  drope       {step, n_params}                     positions dropped after update `step` (train.drope_at)
  end         {result}
The CLI renders them (rich progress bar on a terminal, plain lines otherwise). Around the loop: `run_dir` (run
names, config checks), `outcome` (results), `interrupts` (signals, the run lock), `validation` (the validation loss),
`drope` (train.drope_at: where the positions are dropped, and how a checkpoint records it), `data.rows` (the rows
of a batch by train.packing, and the targets train.loss_on counts).
"""

from __future__ import annotations

import contextlib
import json
import math
import platform
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from posenc_cli import __version__
from posenc_cli.config import Config, config_to_yaml
from posenc_cli.data.cache import document_starts, load_corpus
from posenc_cli.data.examples import longest_spans
from posenc_cli.data.rows import (
    Rows,
    check_examples_fit,
    draw_examples,
    example_rows,
    find_examples,
    packed_rows,
    stream_rows,
)
from posenc_cli.data.tokenizer import load_tokenizer
from posenc_cli.errors import CheckpointError, ConfigError, UserError
from posenc_cli.model import build_model
from posenc_cli.positional import build_scheme
from posenc_cli.positional.ids import pose_position_ids, random_position_ids
from posenc_cli.run import compile as compiling
from posenc_cli.run import distributed
from posenc_cli.run.device import Precision, autocast, resolve_device, resolve_precision, threads
from posenc_cli.run.distributed import DistInfo
from posenc_cli.run.drope import DROPPED_KEY, check_drope, drop_as_recorded, dropped_at, dropped_record
from posenc_cli.run.interrupts import LOCK_FILE, Interrupts, run_lock
from posenc_cli.run.journal import commit_checkpoint, committed_file, recover
from posenc_cli.run.layout import CONFIG_FILE, META_FILE, METRICS_FILE, MODEL_FILE, STATE_FILE, STATE_JSON
from posenc_cli.run.load import load_run, read_config
from posenc_cli.run.memory import (
    MAX_STEP_S,
    TRAIN_BYTES_PER_PARAM,
    approx_params,
    available_memory,
    check_fits,
    gib,
    micro_batch_bytes,
    planned_vocab_size,
    step_seconds_at_least,
    validation_bytes,
)
from posenc_cli.run.meta import RunMeta, TrainingRecord, read_meta
from posenc_cli.run.metrics import MetricsLog
from posenc_cli.run.optim import build_optimizer, lr_at
from posenc_cli.run.outcome import TrainResult, result_from_meta
from posenc_cli.run.resume_state import (
    capture_rng,
    pack_optimizer,
    read_state,
    restore_rng,
    state_file_bytes,
    unpack_optimizer,
)
from posenc_cli.run.run_dir import CLAIM_FILE, claim_run_dir, config_diff, existing_meta, model_preset_name
from posenc_cli.run.validation import ValidationSet, evaluate_loss, evaluate_scored, scored_nll, validation_set
from posenc_cli.run.verified import load_tensors, read_verified
from posenc_cli.run.weights import load_weights_into, model_file_bytes, tokenizer_files

Callback = Callable[[dict[str, Any]], None]


@dataclass
class _Batch:
    """One micro-batch on this rank: inputs, targets, position ids, document ids, the targets the loss counts (None:
    all), all (B/N, T); `real` and `scored`: input tokens that are not padding and counted targets of the whole
    (global) micro-batch."""

    x: Tensor
    y: Tensor
    position_ids: Tensor | None
    documents: Tensor | None
    weights: Tensor | None
    real: int
    scored: int


class TrainingDiverged(UserError):
    """A non-finite loss or gradient norm: training stopped before the optimizer step."""

    def __init__(self, step: int, what: str, value: float, run_dir: Path, last_good: int) -> None:
        self.step = step
        self.last_good = last_good
        super().__init__(
            f"non-finite {what} ({value}) at step {step}; stopped before the optimizer step. "
            f"The last good checkpoint (step {last_good}) is in {run_dir}"
        )


# ----------------------------------------------------------------------------------------------------------------
# The entry point.


def train(
    cfg: Config,
    out_dir: Path,
    *,
    resume: bool = False,
    force_config: bool = False,
    init_from: Path | None = None,
    meta_extra: dict[str, Any] | None = None,
    callback: Callback | None = None,
) -> TrainResult:
    """Train `cfg` into run directory `out_dir`, continuing it if it already holds a run.

    `resume=True` requires an existing run. An existing run with a different config is refused unless
    `force_config`. A run already at `cfg.train.steps` returns at once (`stopped_reason="already_complete"`).
    `init_from`: start from another run's weights (fine-tuning); `meta_extra`: extra meta.json keys, e.g.
    {"parent": ..., "base_length": ...}.
    """
    cfg.validate()
    check_budget(cfg)  # before any allocation, and before anything is written
    _check_position_reach(cfg)
    check_drope(cfg)
    run_dir = Path(out_dir)
    info = distributed.env_info()  # under torchrun: this rank of a data-parallel job (see posenc_cli.run.distributed)
    distributed.check_batch(cfg.train.batch_size, info)
    emit: Callback = (callback or (lambda event: None)) if info.is_main else (lambda event: None)
    device = distributed.rank_device(resolve_device(cfg.train.device), info)
    compiling.check_compile(cfg.train.compile, device)  # no compiler: one line before anything is written
    with distributed.process_group(info, device):
        if info.enabled:
            with distributed.main_first(info):  # rank 0 finishes an interrupted commit before anyone reads
                if info.is_main and run_dir.is_dir():
                    recover(run_dir)
        meta = existing_meta(run_dir)
        distributed.barrier(info)  # every rank has read the run's state before rank 0 writes anything
        if meta is None and resume:
            raise CheckpointError(f"{run_dir} is not a posenc run directory (nothing to resume)")
        if meta is not None:
            diffs = config_diff(read_config(run_dir, meta), cfg)
            if diffs and not force_config:
                shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
                raise ConfigError(
                    f"{run_dir} was trained with a different config ({shown}); use the same overrides to continue "
                    "it, or pass --force-config to continue with the new config"
                )
            if int(meta["step"]) >= cfg.train.steps:
                return result_from_meta(run_dir, meta)
        fresh = meta is None and info.is_main
        new_dirs, had = (_missing_dirs(run_dir), _names(run_dir)) if fresh else ([], set())
        if info.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            if meta is None:
                claim_run_dir(run_dir)  # before anything else is written: its contents are posenc's from now on
        lock = run_lock(run_dir) if info.is_main else contextlib.nullcontext()
        try:
            with lock, threads(cfg.train.threads) as n_threads:
                trainer = _Trainer(
                    cfg, run_dir, meta, force_config, init_from, meta_extra, emit, n_threads, info, device
                )
                return trainer.run()
        except BaseException:
            if fresh:
                _unclaim(run_dir, had, new_dirs)
            raise


def _missing_dirs(path: Path) -> list[Path]:
    """The directories `path.mkdir(parents=True)` would create, deepest first."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()} if directory.is_dir() else set()


def _unclaim(run_dir: Path, had: set[str], new_dirs: list[Path]) -> None:
    """A fresh run that stopped before its first checkpoint: remove what this call created (the claim and the lock
    file, then the directories it made, if empty). Once anything else appeared (a checkpoint, even one half
    committed) the directory is a run and stays as it is; files that were there before are never touched."""
    added = _names(run_dir) - had
    if not added <= {CLAIM_FILE, LOCK_FILE}:
        return
    with contextlib.suppress(OSError):
        for name in added:
            (run_dir / name).unlink()
        for directory in new_dirs:
            directory.rmdir()


def check_budget(cfg: Config, available: int | None = None) -> None:
    """`ConfigError` (one line) when training `cfg` certainly cannot run here: the model, a micro-batch's
    activations or the validation windows need more memory than is `available` (default: what the system says),
    or one optimizer step's micro-steps could not finish within `MAX_STEP_S` even at `PEAK_FLOPS`.

    Pure arithmetic on the config (lower bounds from `posenc_cli.run.memory`): nothing is allocated or written, so
    a dry run (a sweep's plan) can call it for every job.
    """
    tc, vocab = cfg.train, planned_vocab_size(cfg)
    available = available_memory() if available is None else available
    check_fits(cfg, vocab, TRAIN_BYTES_PER_PARAM, "training", available)
    table = tc.seq_len if cfg.pos.name == "learned" else 0
    n_params = approx_params(cfg.model, vocab, table)
    model_bytes = n_params * TRAIN_BYTES_PER_PARAM
    micro = micro_batch_bytes(cfg.model, vocab, tc.batch_size, tc.seq_len)
    if available is not None and model_bytes + micro > available:
        besides = f" besides the model's {gib(model_bytes)}" if model_bytes >= 2**30 // 10 else ""
        raise ConfigError(
            f"train.batch_size={tc.batch_size} × train.seq_len={tc.seq_len} needs at least {gib(micro)} of "
            f"activations per micro-batch{besides}, but {gib(available)} is available; lower train.batch_size "
            "(train.grad_accum keeps the tokens per step)"
        )
    windows = validation_bytes(tc.batch_size, tc.seq_len, tc.eval_batches)
    if available is not None and model_bytes + windows > available:
        raise ConfigError(
            f"train.eval_batches={tc.eval_batches} validation batches of {tc.batch_size} × {tc.seq_len + 1} tokens "
            f"need about {gib(windows)}, but {gib(available)} is available; lower train.eval_batches"
        )
    step_s = step_seconds_at_least(n_params, tc.batch_size, tc.seq_len, tc.grad_accum)
    if step_s > MAX_STEP_S:
        raise ConfigError(
            f"train.grad_accum={tc.grad_accum} micro-batches of {tc.batch_size} × {tc.seq_len} tokens make one "
            f"optimizer step of at least {step_s / 86_400:,.0f} days even on the fastest hardware; lower "
            "train.grad_accum"
        )


def _check_position_reach(cfg: Config) -> None:
    """Refuse training ids (train.random_positions, train.pose_length) past what the scheme can encode."""
    reach = max(cfg.train.random_positions, cfg.train.pose_length)
    if not reach:
        return
    limit = build_scheme(cfg.pos, cfg.model, cfg.train.seq_len).max_length
    if limit is not None and reach > limit:
        key = "random_positions" if cfg.train.random_positions else "pose_length"
        hint = f"; set pos.table_size={reach}" if hasattr(cfg.pos, "table_size") else ""
        raise ConfigError(
            f"train.{key}={reach} gives position ids up to {reach - 1}, but pos={cfg.pos.name} encodes at most "
            f"{limit} positions{hint}"
        )


def _session_precision(precision: str, device: torch.device, prev: RunMeta | None) -> Precision:
    """The precision of this session: `precision=auto` continues a run in the precision it trained in, so a run has
    one precision and the label in its meta.json (what its evaluations compute in) stays true when it is resumed on
    another machine; an explicit fp32/bf16 applies as given (changing it needs --force-config)."""
    recorded = prev.record.get("precision") if prev is not None else None
    if precision == "auto" and recorded in ("fp32", "bf16"):
        return resolve_precision(str(recorded), device)
    return resolve_precision(precision, device)


class _Trainer:
    """One training session of a run directory (fresh or resumed); `run()` is the loop."""

    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        meta: dict[str, Any] | None,
        force_config: bool,
        init_from: Path | None,
        meta_extra: dict[str, Any] | None,
        emit: Callback,
        n_threads: int,
        info: DistInfo = distributed.SINGLE,
        device: torch.device | None = None,
    ) -> None:
        self.cfg, self.tc, self.run_dir, self.emit, self.n_threads = cfg, cfg.train, run_dir, emit, n_threads
        self.dist = info
        self.resumed = meta is not None
        self.device = device if device is not None else resolve_device(cfg.train.device)
        if meta is not None:
            if info.is_main:
                recover(run_dir)
            meta = read_meta(run_dir)
        self.prev_meta = RunMeta.from_json(meta) if meta is not None else RunMeta(step=0)
        self.precision = _session_precision(cfg.train.precision, self.device, self.prev_meta if meta else None)
        self.meta_extra = self.prev_meta.extra | (meta_extra or {})

        tokenizer, parent = None, None
        if meta is not None:
            if "tokenizer.json" in meta["files"]:
                read_verified(run_dir, meta["files"], "tokenizer.json")
            tokenizer = load_tokenizer(cfg.tokenizer, committed_file(run_dir, "tokenizer.json").parent)
        elif init_from is not None:
            parent = load_run(init_from)
            tokenizer = parent.tokenizer
            inherited = {"parent": str(init_from), "base_length": parent.meta.base_length}
            self.meta_extra = inherited | self.meta_extra

        def progress(stage: str, done: int, total: int) -> None:
            emit({"event": "data", "stage": stage, "done": done, "total": total})

        with distributed.main_first(info):  # rank 0 builds the token cache; the others then read it
            self.corpus = load_corpus(cfg.data, cfg.tokenizer, tokenizer=tokenizer, progress=progress)
        self.tokenizer = self.corpus.tokenizer
        self.data_info = json.loads(json.dumps(self.corpus.info, default=str))
        if meta is not None:
            self._check_same_data(meta, force_config)
        self.tok_files = tokenizer_files(self.tokenizer)

        seed = cfg.train.seed
        random.seed(seed)
        np.random.seed(seed % 2**32)  # numpy's legacy seed is 32-bit; train.seed goes up to 2**63 - 1
        torch.manual_seed(seed)
        self.model = build_model(cfg, self.tokenizer.vocab_size)
        if meta is not None and dropped_at(meta, committed_file(run_dir, META_FILE)) is not None:
            drop_as_recorded(self.model, meta)  # the checkpoint holds the model without its scheme's parameters
        elif parent is not None and parent.model.positions_dropped:
            keep = parent.model.keeps_layout
            self.model.drop_positions(keep_layout=keep)  # a child of a dropped run starts without positions
            self.meta_extra = dropped_record(0, keep) | self.meta_extra
        if parent is not None:
            try:
                self.model.load_state_dict(parent.model.state_dict(), strict=True)
            except RuntimeError as e:
                raise CheckpointError(f"{init_from}: weights do not fit this config ({str(e).splitlines()[0]})") from e
        self.sampler = torch.Generator().manual_seed(seed + 1)
        self.step, self.tokens, self.elapsed_before = 0, 0, 0.0
        self.scored_tokens = 0  # targets the loss counted (= tokens under train.loss_on=all, packing=stream)
        self.best_val: float | None = None
        self.train_loss: float | None = None
        self.val_loss: float | None = None
        self.metrics = MetricsLog(run_dir / METRICS_FILE)
        if meta is not None:
            load_weights_into(self.model, load_tensors(run_dir, meta, MODEL_FILE), committed_file(run_dir, MODEL_FILE))
        self.model.to(self.device)
        self._wrap()
        self.optimizer = build_optimizer(self.model, cfg.train, self.device)
        if meta is not None:
            self._restore(meta)
        elif info.is_main:
            self.metrics.path.unlink(missing_ok=True)  # leftovers of a run killed before its first checkpoint
        self.dropped_now = self._drop_if_due()  # a run continued past train.drope_at (--force-config, extra steps)
        if info.rank > 0:  # own dropout streams per rank (the sampler stream is shared: see _batch)
            torch.manual_seed(distributed.rank_seed(seed, info.rank, self.step))
        tc = self.tc
        self.examples = None
        if tc.packing != "stream":  # refused in one line before training when an example does not fit a row
            self.examples = find_examples(self.corpus.train, self.tokenizer.eod_id)
            check_examples_fit(self.examples, tc.seq_len, tc.packing, "training")
            # no example it trains on is longer, no answer further in: the gate's in-distribution bound (issue #38)
            longest, prompt = longest_spans(self.examples, self.corpus.train_scored)
            self.data_info.update(longest_example=longest, longest_prompt=prompt)
        vset = validation_set(
            self.corpus.val,
            self.corpus.val_scored,
            tc.batch_size,
            tc.seq_len,
            tc.eval_batches,
            packing=tc.packing,
            answer_only=tc.loss_on == "answer",
            eod_id=self.tokenizer.eod_id,
        )
        self.windows = distributed.shard_rows(vset.windows, info, dim=1).to(self.device)  # (n, B/N, T+1) per rank
        self.val_weights = None  # (n, B/N, T) per rank: the targets validation counts (None: all)
        if vset.weights is not None:
            self.val_weights = distributed.shard_rows(vset.weights, info, dim=1).to(self.device)
        self.saved: tuple[int, str] | None = (self.step, str(self.prev_meta.status)) if meta is not None else None
        compiling.warm_up(self._dummy_forward, self.params, self.device, cfg.train.compile)  # before the clock

    def _wrap(self) -> None:
        """The training view of `self.model` (DDP in a job, compiled with train.compile) and its parameters."""
        self.ddp = distributed.wrap_model(self.model, self.dist, self.device)  # the model itself without torchrun
        self.ddp = compiling.compile_model(self.ddp, self.tc.compile, self.n_threads)  # training steps only
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    def _drop_if_due(self) -> bool:
        """DroPE's switch (`posenc_cli.run.drope`), once train.drope_at updates are done: the model drops its
        positions, the wrappers are rebuilt over what is left, and so is AdamW, each kept parameter with its moments
        and step count and the groups with their settings (the scheme's parameters and their state are gone). Draws
        no random numbers, so a run resumed across the switch stays bitwise identical. True when it switched."""
        k = self.tc.drope_at
        if not k or self.step < k or self.model.positions_dropped:
            return False
        self.model.drop_positions()
        old = self.optimizer
        self._wrap()
        self.optimizer = build_optimizer(self.model, self.tc, self.device)
        for new_group, old_group in zip(self.optimizer.param_groups, old.param_groups, strict=True):
            new_group.update({key: value for key, value in old_group.items() if key != "params"})
        for p in self.params:
            if p in old.state:
                self.optimizer.state[p] = old.state[p]
        self.meta_extra = self.meta_extra | dropped_record(self.step)
        return True

    def _emit_drope(self) -> None:
        self.emit({"event": "drope", "step": self.step, "n_params": sum(p.numel() for p in self.params)})

    def _dummy_forward(self) -> Tensor:
        """The training forward on a batch of zeros shaped as this rank's batches (what `warm_up` compiles)."""
        tc = self.tc
        x = distributed.shard_rows(torch.zeros(tc.batch_size, tc.seq_len, dtype=torch.long), self.dist)
        x = x.to(self.device)  # (B/N, T)
        with autocast(self.device, self.precision):
            if tc.packing == "document":
                ids = torch.arange(tc.seq_len, device=self.device).expand_as(x).contiguous()
                return self.ddp(x, position_ids=ids, documents=torch.zeros_like(x))
            if not (tc.random_positions or tc.pose_length):
                return self.ddp(x)
            return self.ddp(x, position_ids=torch.arange(tc.seq_len, device=self.device).expand_as(x).contiguous())

    def _check_same_data(self, meta: dict[str, Any], force_config: bool) -> None:
        old = (meta.get("data") or {}).get("fingerprint")
        new = self.data_info.get("fingerprint")
        if old is not None and new is not None and old != new and not force_config:
            raise ConfigError(
                f"the corpus changed since {self.run_dir} was started (data fingerprint {old} -> {new}); "
                "pass --force-config to continue on the new data"
            )

    def _restore(self, meta: dict[str, Any]) -> None:
        tensors, info = read_state(self.run_dir, meta)
        unpack_optimizer(self.optimizer, tensors, info["optimizer"], committed_file(self.run_dir, STATE_JSON))
        self.step, self.tokens = int(info["step"]), int(info["tokens"])
        self.scored_tokens = int(info.get("scored_tokens", info["tokens"]))  # saved before the count: every token
        self.elapsed_before = float(info.get("elapsed_s", 0.0))
        self.best_val, self.train_loss = info.get("best_val_loss"), info.get("train_loss")
        self.val_loss = info.get("val_loss")
        if self.dist.is_main:
            self.metrics.truncate_after(self.step)
        # all RNG states, the batch sampler's included; last: nothing may draw random numbers after this
        restore_rng(tensors, info["rng"], self.sampler)

    # -- the loop ------------------------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        tc, steps = self.tc, self.tc.steps
        tokens_per_step = tc.batch_size * tc.grad_accum * tc.seq_len
        self.session_start = time.perf_counter()
        self.train_time, self.session_tokens = 0.0, 0
        log_t, log_tokens = 0.0, 0
        if self.saved is None:
            self._save("running")
        self.emit(
            {
                "event": "start",
                "run_dir": self.run_dir,
                "step": self.step,
                "steps": steps,
                "resumed": self.resumed,
                "device": str(self.device),
                "precision": self.precision,
                "threads": self.n_threads,
                "compile": compiling.describe(tc.compile),
                "n_params": sum(p.numel() for p in self.params),
                "tokens_per_step": tokens_per_step,
                "tokens": self.tokens,
                "seq_len": tc.seq_len,
            }
        )
        if self.dropped_now:
            self._emit_drope()
        V = self.tokenizer.vocab_size
        self.model.train()
        with Interrupts(defer=self.dist.enabled) as interrupts:
            while self.step < steps and interrupts.signum is None:
                lr = lr_at(self.step, tc)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                t0 = time.perf_counter()
                loss_sum = torch.zeros((), device=self.device)
                # a signal stops a long accumulation between micro-steps (not in a job: the ranks' collectives
                # must stay in step); the step is then undone, its random draws too, and runs again on resume
                rng_at_start = capture_rng(self.sampler) if tc.grad_accum > 1 and not self.dist.enabled else None
                stopped_within = False
                compiling.step_begin(tc.compile, self.device)  # CUDA graphs: one iteration per optimizer step
                step_tokens = counted = 0  # input tokens (no padding) and counted targets of the global batch
                weighted = False
                for micro in range(tc.grad_accum):
                    if rng_at_start is not None and interrupts.signum is not None:
                        stopped_within = True
                        break
                    b = self._batch()
                    weighted = b.weights is not None
                    with self._sync_grads(last=micro == tc.grad_accum - 1):
                        with autocast(self.device, self.precision):
                            logits = self._forward(b)  # (B, T, V); B/N rows per rank in a data-parallel job
                        if weighted:  # summed over this rank's counted targets; divided by the step's count below
                            assert b.weights is not None
                            loss = scored_nll(logits, b.y, b.weights)
                            share = loss * self.dist.world_size  # DDP averages the ranks' gradients: their sum
                        else:  # every target counts: the mean of each micro-batch, as always
                            loss = F.cross_entropy(logits.float().reshape(-1, V), b.y.reshape(-1))
                            share = loss / tc.grad_accum
                        share.backward()
                    loss_sum += loss.detach()
                    step_tokens, counted = step_tokens + b.real, counted + b.scored
                if stopped_within:
                    assert rng_at_start is not None
                    self.optimizer.zero_grad(set_to_none=True)
                    restore_rng(*rng_at_start, self.sampler)
                    break
                if weighted:  # the mean over the counted targets of the global batch (grad_accum, ranks: one pool)
                    scale = 1.0 / max(counted, 1)
                    for p in self.params:
                        if p.grad is not None:
                            p.grad.mul_(scale)
                    if self.dist.enabled:
                        loss_sum = distributed.all_reduce_(loss_sum, self.dist)
                    step_loss = loss_sum * scale
                else:
                    if self.dist.enabled:  # the global batch's mean loss, identical on every rank
                        loss_sum = distributed.all_reduce_(loss_sum, self.dist) / self.dist.world_size
                    step_loss = loss_sum / tc.grad_accum
                gnorm = self._clip()
                loss_val, gnorm_val = torch.stack([step_loss, gnorm.float()]).tolist()  # one sync
                if not math.isfinite(loss_val) or not math.isfinite(gnorm_val):
                    what, value = ("loss", loss_val) if not math.isfinite(loss_val) else ("gradient norm", gnorm_val)
                    self.metrics.close()
                    last = self.saved[0] if self.saved else 0
                    raise TrainingDiverged(self.step + 1, what, value, self.run_dir, last)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                if self.dist.enabled:
                    interrupts.agree(self.dist, self.device)
                self.step += 1
                if self._drop_if_due():  # before this step's validation and checkpoint: both see the dropped model
                    self._emit_drope()
                    compiling.warm_up(self._dummy_forward, self.params, self.device, tc.compile)
                self.tokens += step_tokens
                self.scored_tokens += counted
                self.session_tokens += step_tokens
                dt = time.perf_counter() - t0
                self.train_time += dt
                log_t, log_tokens = log_t + dt, log_tokens + step_tokens
                self.train_loss = loss_val
                val = None
                if self.step % tc.eval_every == 0 or self.step == steps:
                    val = self._evaluate()
                logged = self.step % tc.log_every == 0 or self.step == steps or val is not None
                tps = self.session_tokens / max(self.train_time, 1e-9)
                interval_tps = log_tokens / max(log_t, 1e-9)
                if logged and self.dist.is_main:
                    self.metrics.append(
                        {
                            "step": self.step,
                            "tokens": self.tokens,
                            "scored_tokens": self.scored_tokens,
                            "train_loss": loss_val,
                            "val_loss": val,
                            "lr": lr,
                            "grad_norm": gnorm_val,
                            "tokens_per_s": interval_tps,
                            "wall_time_s": self._elapsed(),
                        }
                    )
                    log_t, log_tokens = 0.0, 0
                self.emit(
                    {
                        "event": "step",
                        "step": self.step,
                        "steps": steps,
                        "loss": loss_val,
                        "lr": lr,
                        "grad_norm": gnorm_val,
                        "tokens": self.tokens,
                        "scored_tokens": self.scored_tokens,
                        "tokens_per_s": tps,
                        "interval_tokens_per_s": interval_tps,
                        "elapsed_s": self._elapsed(),
                        "logged": logged,
                    }
                )
                if self.step == steps:
                    self._save("complete")
                elif self.step % tc.save_every == 0 or interrupts.signum is not None:
                    self._save("interrupted" if interrupts.signum is not None else "running")
            signum = interrupts.signum
        if signum is not None and self.step < steps:
            if self.saved != (self.step, "interrupted"):
                self._save("interrupted")
            return self._finish("interrupted", signum)
        if self.saved != (self.step, "complete"):  # e.g. steps=0, or resumed at exactly the final step
            if self.val_loss is None or self.step % tc.eval_every != 0:
                self._evaluate()
            self._save("complete")
        return self._finish("complete", None)

    def _window_starts(self) -> np.ndarray | None:
        """The allowed window offsets of train.window_start=document (found once), None for uniform offsets."""
        if self.tc.window_start != "document":
            return None
        if getattr(self, "_document_starts", None) is None:
            self._document_starts = document_starts(self.corpus.train, self.tokenizer.eod_id, self.tc.seq_len)
        return self._document_starts

    def _rows(self) -> Rows:
        """The next global batch's rows by train.packing, drawn from the sampler stream (`data.rows`)."""
        tc, corpus, eod = self.tc, self.corpus, self.tokenizer.eod_id
        answer = tc.loss_on == "answer"
        if self.examples is None:
            starts, scored = self._window_starts(), corpus.train_scored
            return stream_rows(corpus.train, scored, tc.batch_size, tc.seq_len, self.sampler, starts, answer)
        if tc.packing == "none":
            picks = draw_examples(self.examples, tc.batch_size, self.sampler)
            return example_rows(corpus.train, corpus.train_scored, self.examples, picks, tc.seq_len, eod, answer)
        return packed_rows(
            corpus.train, corpus.train_scored, self.examples, tc.batch_size, tc.seq_len, self.sampler, eod, answer
        )

    def _batch(self) -> _Batch:
        """The next global batch (B, T) from the sampler stream, its position ids (B, T) (None: 0..T−1, unless
        train.packing=document, train.random_positions or train.pose_length, drawn from the same stream), document
        ids and counted targets; in a job, this rank's B/N rows."""
        tc = self.tc
        rows = self._rows()
        ids = rows.position_ids
        if tc.random_positions:
            layers = self.cfg.model.n_layer if tc.random_positions_draw == "layer" else 0  # (B, n_layer, T) ids
            ids = random_position_ids(tc.batch_size, tc.seq_len, tc.random_positions, self.sampler, layers)
        elif tc.pose_length:
            ids = pose_position_ids(tc.batch_size, tc.seq_len, tc.pose_length, self.sampler, tc.pose_chunks)

        def mine(t: Tensor | None) -> Tensor | None:
            return None if t is None else distributed.shard_rows(t, self.dist).to(self.device, non_blocking=True)

        x, y = mine(rows.tokens[:, :-1].contiguous()), mine(rows.tokens[:, 1:].contiguous())
        assert x is not None and y is not None
        return _Batch(x, y, mine(ids), mine(rows.documents), mine(rows.weights), rows.real, rows.scored)

    def _forward(self, b: _Batch) -> Tensor:
        if b.documents is not None:
            return self.ddp(b.x, position_ids=b.position_ids, documents=b.documents)
        return self.ddp(b.x) if b.position_ids is None else self.ddp(b.x, position_ids=b.position_ids)

    def _sync_grads(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        """DDP averages gradients on the last micro-batch of a step only (no_sync before it)."""
        if self.dist.enabled and not last:
            return self.ddp.no_sync()  # type: ignore[operator]
        return contextlib.nullcontext()

    def _clip(self) -> Tensor:
        if self.tc.grad_clip > 0:
            return torch.nn.utils.clip_grad_norm_(self.params, self.tc.grad_clip)
        return torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])

    def _evaluate(self) -> float:
        """Validation loss on the fixed windows; in a job each rank scores its rows and the mean is all-reduced."""
        start = time.perf_counter()
        if self.val_weights is not None:  # the mean over the counted targets of every rank's rows
            vset = ValidationSet(self.windows, self.val_weights)
            sums = torch.tensor(evaluate_scored(self.model, vset, self.device, self.precision), dtype=torch.float64)
            if self.dist.enabled:
                sums = distributed.all_reduce_(sums.to(self.device), self.dist)
            total, count = sums.tolist()
            val = total / max(count, 1.0)
        else:
            val = evaluate_loss(self.model, self.windows, self.device, self.precision)
        if self.dist.enabled and self.val_weights is None:
            t = distributed.all_reduce_(torch.tensor(val, dtype=torch.float64, device=self.device), self.dist)
            val = float(t.item()) / self.dist.world_size
        self.val_loss = val
        if math.isfinite(val) and (self.best_val is None or val < self.best_val):
            self.best_val = val
        self.emit({"event": "eval", "step": self.step, "val_loss": val, "seconds": time.perf_counter() - start})
        return val

    def _elapsed(self) -> float:
        return self.elapsed_before + (time.perf_counter() - self.session_start)

    # -- saving --------------------------------------------------------------------------------------------------
    def _save(self, status: str) -> None:
        start = time.perf_counter()
        if not all(bool(torch.isfinite(p).all()) for p in self.params):
            raise TrainingDiverged(self.step, "weights", float("nan"), self.run_dir, self.saved[0] if self.saved else 0)
        if not self.dist.is_main:  # rank 0 writes for the job
            self.saved = (self.step, status)
            return
        self.metrics.flush(durable=True)
        opt_tensors, opt_info = pack_optimizer(self.optimizer)
        rng_tensors, rng_info = capture_rng(self.sampler)
        state = {
            "step": self.step,
            "tokens": self.tokens,
            "scored_tokens": self.scored_tokens,
            "best_val_loss": self.best_val,
            "train_loss": self.train_loss,
            "val_loss": self.val_loss,
            "elapsed_s": self._elapsed(),
            "scheduler": {"name": "warmup_cosine", "step": self.step},
            "optimizer": opt_info,
            "rng": rng_info,
        }
        files = {
            MODEL_FILE: model_file_bytes(self.model),
            STATE_FILE: state_file_bytes({**opt_tensors, **rng_tensors}),
            STATE_JSON: json.dumps(state).encode(),
            CONFIG_FILE: config_to_yaml(self.cfg).encode(),
            **self.tok_files,
        }
        commit_checkpoint(self.run_dir, files, self._meta(status))
        self.saved = (self.step, status)
        self.emit({"event": "checkpoint", "step": self.step, "status": status, "seconds": time.perf_counter() - start})

    def _meta(self, status: str) -> RunMeta:
        now = datetime.now(UTC).isoformat(timespec="seconds")
        tps = self.session_tokens / self.train_time if self.train_time else None
        record = TrainingRecord(
            steps=self.tc.steps,
            tokens=self.tokens,
            train_loss=self.train_loss,
            val_loss=self.val_loss,
            best_val_loss=self.best_val,
            seed=self.tc.seed,
            pos=self.cfg.pos.name,
            model=model_preset_name(self.cfg),
            n_params=sum(p.numel() for p in self.params),
            precision=self.precision,
            device=str(self.device),
            threads=self.n_threads,
            tokens_per_s=tps if tps is not None else self.prev_meta.record.get("tokens_per_s"),
            wall_time_s=self._elapsed(),
            created=self.prev_meta.record.get("created", now),
            updated=now,
            versions={
                "posenc": __version__,
                "torch": torch.__version__,
                "python": platform.python_version(),
                "numpy": np.__version__,
            },
            data=self.data_info,
            tokenizer={
                "kind": self.tokenizer.kind,
                "vocab_size": self.tokenizer.vocab_size,
                "fingerprint": self.tokenizer.fingerprint,
            },
        )
        return RunMeta.for_training(
            status=status, step=self.step, train_length=self.tc.seq_len, record=record, extra=self.meta_extra
        )

    def _finish(self, reason: Literal["complete", "interrupted"], signum: int | None) -> TrainResult:
        self.metrics.close()
        result = TrainResult(
            run_dir=self.run_dir,
            step=self.step,
            steps=self.tc.steps,
            tokens=self.tokens,
            train_loss=self.train_loss,
            val_loss=self.val_loss,
            val_ppl=math.exp(self.val_loss) if self.val_loss is not None and self.val_loss < 700 else None,
            best_val_loss=self.best_val,
            tokens_per_s=self.session_tokens / self.train_time if self.train_time else 0.0,
            wall_time_s=self._elapsed(),
            precision=self.precision,
            device=str(self.device),
            stopped_reason=reason,
            signal=signum,
            positions_dropped_at=self.meta_extra.get(DROPPED_KEY),
        )
        self.emit({"event": "end", "result": result})
        return result


__all__ = ["TrainingDiverged", "check_budget", "train"]
