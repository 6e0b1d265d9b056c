"""`posenc calibrate`: fit the attention temperature a trained run is evaluated with, into a new child run.

Two entries of the temperature registry (`posenc_cli.temperatures`) are fitted on a frozen model:

- `drope`, DroPE's β = 1 + c·ln(s) (Gelberg et al. 2025, arXiv 2512.12167; `temperatures.drope`), by default in
  the reference's form, one β per evaluation cell with s = the cell's length over L (`form="cell"`; `"query"`:
  posenc's earlier per-query s, recorded in the child's `model.temperature_form`). c is the one number fitted, by
  minimising the mean token loss at the fit lengths s·L (s > 1). A 1-D search: a grid of the multiples of `step`
  from c_min to c_max (default −0.5, −0.4, ..., 2, so c = 0, the parent, is always scored), cut below where β
  would reach 0 at the longest fit length (c > −1/ln s), then golden-section search on the grid's best bracket
  [c* − step, c* + step] (`refine` more scores; every candidate rounded to 4 decimals before it is scored, so the
  recorded c is a scored value). A c below 0 (β < 1, flatter attention) is fitted when it lowers the loss; a best c
  at either end of the searched range is reported as that edge (`at_edge`, `c_range`), not as a minimum. The paper
  states that c is fitted on held-out data (its c: 0.412 from scratch, 0.103 for SmolLM) but neither it nor
  `SakanaAI/DroPE` gives the search (the repository only sets a constant `softmax_scale`,
  `custom_models/attention.py:95-97`); the grid and the golden section are posenc's. With several lengths, the
  objective is the mean over lengths of each length's mean token loss.
- `head-scale`, NoPE HeadScale (Wang et al. 2024, arXiv 2404.12224): λ_h per layer and head trained at the longer
  length with every other weight frozen, as `AntNLP/nope_head_scale` does (`models/llama_nope.py:64-71`): AdamW with
  betas (0.9, 0.95), no weight decay, gradient norm clipped at 1, linear warm-up over the first 10% of the steps then
  cosine decay to 0 (`configs/basic.yaml`, `configs/tnl_hs.yaml`; 200 steps at lr 0.1 or 0.05 from λ = 1.6 in
  `scripts/run_hs.sh:33-49`). posenc's defaults: 200 steps, lr 0.05, λ = 1 (the trained model unchanged), batches
  of 4 windows cycling through the fit windows in order, dropout off (the reference trains with TinyLlama's 0).

Fit tokens, held apart from every evaluation: the first windows of the run's *training* split by default, as the
LongRoPE search does (`extension.longrope_search`: posenc's evaluations read only the validation split, so a
temperature fitted there would be scored on its own fit tokens); `split="val"` fits on the validation split
instead, and the child records which (`fit.data`). Those training tokens were trained on at length L, but never in
windows of s·L.

The child is a new run directory, like `extend`'s: the parent is never modified, meta.json links it (`parent`,
`extend.method = "calibrate"` with the fit's settings and result), the config carries the temperature
(`model.attn_scale=drope` with `model.temperature_c`, or `head-scale`), so `eval-extrapolate CHILD` applies it and
evaluation caches, keyed by config, keep the parent's and the child's apart. DroPE's child holds the parent's weights
byte for byte; HeadScale's adds `blocks.<i>.attn.head_scale`. Asked again with the same settings of the same parent
weights, the child there is returned as it is.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F

from posenc_cli import __version__
from posenc_cli.bounds import check_memory, workload_bytes
from posenc_cli.config import Config, config_to_yaml, replace
from posenc_cli.data.cache import eval_windows, load_corpus
from posenc_cli.errors import ConfigError
from posenc_cli.extension.calibrate_settings import (
    CalibrateSettings,
    c_grid,
    check_calibrate,
    check_no_temperature,
    default_out_dir,
    fit_lengths,
)
from posenc_cli.extension.child_run import (
    check_same_keys,
    existing_child,
    is_complete,
    recorded_extension,
    write_scaled_copy,
    writer_lock,
)
from posenc_cli.model import GPT
from posenc_cli.run.device import threads as use_threads
from posenc_cli.run.journal import commit_checkpoint
from posenc_cli.run.layout import CONFIG_FILE, MODEL_FILE
from posenc_cli.run.load import load_run, model_like
from posenc_cli.run.meta import RunMeta
from posenc_cli.run.run_dir import claim_run_dir
from posenc_cli.run.verified import read_verified
from posenc_cli.run.weights import model_file_bytes

if TYPE_CHECKING:
    from posenc_cli.run.load import LoadedRun

__all__ = [
    "CalibrateResult",
    "calibrate_run",
    "fit_drope_c",
    "fit_head_scale",
    "fit_windows",
    "golden_section",
]

IDENTITY_KEYS = ("method", "fit", "parent_weights_sha256")  # a re-run reuses the child when these match
Progress = Callable[[int, int, float], None]  # (scores or steps done, planned, best or current loss)


@dataclass
class CalibrateResult:
    """The child and the fit: `c` (drope) or `head_scale` (layer × head λ); `loss_before`/`loss_after`: mean token
    loss per fit length without and with the fitted temperature (nats); `history`: each score or step."""

    parent_dir: Path
    out_dir: Path
    status: Literal["created", "already_complete"]
    temperature: str
    train_length: int
    lengths: list[int]
    c: float | None = None
    head_scale: list[list[float]] | None = None
    loss_before: dict[int, float] = field(default_factory=dict)
    loss_after: dict[int, float] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    at_edge: bool = False  # drope: the best c is an end of the searched range (`c_range`), a bound, not a minimum
    c_range: list[float] | None = None  # drope: the grid's [lowest, highest] c
    form: str | None = None  # drope: `cell` or `query` (`temperatures.drope`)
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)
    evaluation: list[dict[str, Any]] | None = None  # parent and child side by side (`api.calibrate(evaluate=True)`)

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc.update(parent_dir=str(self.parent_dir), out_dir=str(self.out_dir))
        doc["loss_before"] = {str(k): v for k, v in self.loss_before.items()}
        doc["loss_after"] = {str(k): v for k, v in self.loss_after.items()}
        return doc


def fit_windows(run: LoadedRun, length: int, tokens: int, split: str) -> tuple[torch.Tensor, dict[str, Any]]:
    """((N, length + 1) non-overlapping windows from the start of `split`, N·length ≈ tokens; the tokens covered:
    split, [start, end) offsets, corpus and tokenizer fingerprints)."""
    corpus = load_corpus(run.config.data, run.config.tokenizer, tokenizer=run.tokenizer)
    windows = eval_windows(getattr(corpus, split), length, length, max_windows=max(1, math.ceil(tokens / length)))
    data = {
        "split": split,
        "start": 0,
        "end": int(windows.shape[0]) * length + 1,  # exclusive; the first token is context only
        "fingerprint": str(corpus.info.get("fingerprint") or ""),
        "tokenizer_fingerprint": str(corpus.info.get("tokenizer_fingerprint") or ""),
    }
    return windows, data


def mean_loss(model: GPT, windows: torch.Tensor, batch_tokens: int = 16384) -> float:
    """Mean next-token loss (nats, fp32) of `model` over `windows` (N, T + 1)."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.inference_mode():
        for batch in windows.split(max(1, batch_tokens // windows.shape[1])):
            batch = batch.to(device)
            logits = model(batch[:, :-1]).float()  # (B, T, V)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1), reduction="sum")
            total, count = total + float(loss), count + batch[:, 1:].numel()
    return total / count


def with_temperature(cfg: Config, temperature: str, train_length: int, c: float = 0.0, form: str = "cell") -> Config:
    """The parent's config with `model.attn_scale=temperature` (L = the training length; c and form for drope)."""
    model = replace(
        cfg.model, attn_scale=temperature, logn_length=train_length, temperature_c=float(c), temperature_form=form
    )
    return replace(cfg, model=model)


def golden_section(f: Callable[[float], float], low: float, high: float, n: int, digits: int = 4) -> None:
    """`n` more scores of f on [low, high] by golden-section search, each point rounded to `digits` (f records
    what it scores; a point already scored is looked up by f, not found here)."""
    if n < 2:  # one score (or none): the bracket's middle
        if n == 1:
            f(round((low + high) / 2, digits))
        return
    inv = (math.sqrt(5) - 1) / 2
    a, b = low, high
    x1, x2 = round(b - inv * (b - a), digits), round(a + inv * (b - a), digits)
    f1, f2 = f(x1), f(x2)
    for _ in range(n - 2):
        if f1 <= f2:
            b, x2, f2 = x2, x1, f1
            x1 = round(b - inv * (b - a), digits)
            f1 = f(x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = round(a + inv * (b - a), digits)
            f2 = f(x2)


def fit_drope_c(
    run: LoadedRun,
    windows: dict[int, torch.Tensor],
    train_length: int,
    settings: CalibrateSettings,
    progress: Progress | None = None,
) -> tuple[float, dict[int, float], list[dict[str, float]], list[float]]:
    """DroPE's c minimising the mean over lengths of the mean token loss at each length (module doc): (c, loss per
    length at c, every scored (c, loss), the grid's [lowest, highest] c)."""
    state = run.model.state_dict()
    device = next(run.model.parameters()).device
    scored: dict[float, tuple[float, dict[int, float]]] = {}
    grid = c_grid(settings.step, settings.c_min, settings.c_max, max(windows) / train_length)  # not empty: `validate`
    planned = len(grid) + settings.refine

    def score(c: float) -> float:
        if c not in scored:
            cfg = with_temperature(run.config, "drope", train_length, c, settings.form)
            model = model_like(run, cfg)  # a DroPE run: no PE
            model.load_state_dict(state)
            model.to(device).eval()
            per = {n: mean_loss(model, w) for n, w in windows.items()}
            scored[c] = (sum(per.values()) / len(per), per)
            if progress is not None:
                progress(len(scored), planned, min(v for v, _ in scored.values()))
        return scored[c][0]

    for c in grid:
        score(c)
    best = min(grid, key=lambda c: scored[c][0])
    if settings.refine:
        golden_section(score, max(grid[0], best - settings.step), min(grid[-1], best + settings.step), settings.refine)
    c = min(scored, key=lambda x: (scored[x][0], abs(x), x))  # ties: the c nearest 0 (the parent)
    history = [{"c": k, "loss": v} for k, (v, _) in sorted(scored.items())]
    return c, scored[c][1], history, [grid[0], grid[-1]]


def fit_head_scale(
    run: LoadedRun,
    windows: torch.Tensor,
    train_length: int,
    settings: CalibrateSettings,
    progress: Progress | None = None,
) -> tuple[GPT, list[dict[str, float]]]:
    """The parent's model with λ_h per layer and head trained on `windows` (N, s·L + 1), everything else frozen
    (module doc): (that model, eval mode; the loss of every step)."""
    device = next(run.model.parameters()).device
    model = model_like(run, with_temperature(run.config, "head-scale", train_length))  # a DroPE run: no PE
    missing, unexpected = model.load_state_dict(run.model.state_dict(), strict=False)
    if unexpected or any(not k.endswith(".attn.head_scale") for k in missing):
        raise ConfigError(f"{run.path}: its weights do not fit a head-scale model ({(missing + unexpected)[:3]})")
    model.to(device).eval()  # dropout off: only λ learns
    scales = [p for n, p in model.named_parameters() if n.endswith(".attn.head_scale")]
    for p in model.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        for p in scales:
            p.fill_(settings.init)
            p.requires_grad_(True)
    opt = torch.optim.AdamW(scales, lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, round(0.1 * settings.steps))

    def lr_at(step: int) -> float:  # linear warm-up, then cosine to 0 (transformers' cosine schedule)
        if step < warmup:
            return settings.lr * (step + 1) / warmup
        progress_frac = (step - warmup) / max(1, settings.steps - warmup)
        return settings.lr * 0.5 * (1 + math.cos(math.pi * progress_frac))

    history: list[dict[str, float]] = []
    n = windows.shape[0]
    for step in range(settings.steps):
        rows = [(step * settings.batch_size + i) % n for i in range(settings.batch_size)]
        batch = windows[rows].to(device)  # (B, s·L + 1)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(scales, 1.0)
        opt.step()
        history.append({"step": step + 1, "loss": float(loss.detach())})
        if progress is not None:
            progress(step + 1, settings.steps, history[-1]["loss"])
    for p in scales:
        p.requires_grad_(False)
    return model, history


def calibrate_run(
    parent_dir: Path | str,
    settings: CalibrateSettings,
    out_dir: Path | str | None = None,
    *,
    threads: int = 0,
    progress: Progress | None = None,
) -> CalibrateResult:
    """Fit `settings.temperature` on posenc run `parent_dir` and write the child run holding it (module doc).
    Refused in one line before anything is written: a transformers directory, a parent that already has a
    temperature, bad settings, a fit length the scheme cannot serve, an `out_dir` that is the parent or holds
    anything else (another extension, or this one with other settings); what needs no checkpoint before the parent
    is loaded (`calibrate_settings.check_calibrate`)."""
    parent_path = Path(parent_dir)
    check_calibrate(parent_path, settings, out_dir)
    with use_threads(threads):
        parent = load_run(parent_path)
    cfg = parent.config
    check_no_temperature(parent_path, cfg.model.attn_scale)  # the loaded config's, as load_run verified it
    train_length, base_length = parent.meta.lengths(cfg)
    settings = dataclasses.replace(settings, lengths=fit_lengths(settings.lengths, train_length))
    settings.validate(train_length)
    for n in settings.lengths:
        parent.model.scheme.check_length(n)
    per_forward = max(settings.lengths) * (settings.batch_size if settings.temperature == "head-scale" else 1)
    need = workload_bytes(per_forward, cfg.model.d_model, cfg.model.n_layer, cfg.tokenizer.vocab_size)
    check_memory(need, f"calibrate at {max(settings.lengths)} tokens")
    if out_dir is None:
        out_dir = default_out_dir(parent_path, settings.temperature, settings.lengths, train_length)
    out = Path(out_dir)  # the parent itself refused by `check_calibrate`
    record: dict[str, Any] = {
        "method": "calibrate",
        "scaling": None,
        "remap": None,
        "finetune": None,
        "fit": settings.record(),
        "parent_weights_sha256": str(parent.meta.files[MODEL_FILE]),
        "parent_train_length": train_length,
        "posenc_version": __version__,
    }
    lengths = [int(n) for n in settings.lengths]
    result = CalibrateResult(parent_path, out, "created", settings.temperature, train_length, lengths)
    existing = existing_child(out)
    if existing is not None:
        check_same_keys(out, existing, record, IDENTITY_KEYS)
        if is_complete(out, existing):
            return _recorded(result, existing)

    t0 = time.perf_counter()
    with use_threads(threads):
        fits = {n: fit_windows(parent, n, settings.tokens, settings.split) for n in settings.lengths}
        windows = {n: w for n, (w, _) in fits.items()}
        result.data = {str(n): d for n, (_, d) in fits.items()}
        result.loss_before = {n: mean_loss(parent.model, w) for n, w in windows.items()}
        if settings.temperature == "drope":
            c, after, history, bounds = fit_drope_c(parent, windows, train_length, settings, progress)
            result.c, result.loss_after, result.history, result.c_range = c, after, history, bounds
            result.at_edge, result.form = at_edge(c, bounds, settings.step), settings.form
            child_cfg = with_temperature(cfg, "drope", train_length, c, settings.form)
            fitted = None
        else:
            [(n, w)] = windows.items()
            fitted, result.history = fit_head_scale(parent, w, train_length, settings, progress)
            result.loss_after = {n: mean_loss(fitted, w)}
            result.head_scale = [[round(float(x), 6) for x in b.attn.head_scale] for b in fitted.blocks]
            child_cfg = with_temperature(cfg, "head-scale", train_length)
    result.seconds = round(time.perf_counter() - t0, 3)
    record["temperature"] = {"name": settings.temperature, "c": result.c, "head_scale": result.head_scale}
    if result.form is not None:
        record["temperature"]["form"] = result.form
    kept = ("loss_before", "loss_after", "at_edge", "c_range", "history", "seconds", "data")
    record["result"] = {k: v for k, v in result.to_json().items() if k in kept}
    extra = {"parent": str(parent_path.resolve()), "base_length": base_length, "extend": record}
    with writer_lock(out):
        existing = existing_child(out)  # again under the lock: another writer may have finished
        if existing is not None:
            check_same_keys(out, existing, record, IDENTITY_KEYS)
            if is_complete(out, existing):
                return _recorded(result, existing)
        else:
            claim_run_dir(out)
        if fitted is None:
            write_scaled_copy(parent, out, child_cfg, extra, train_length)  # the parent's weights, byte for byte
        else:
            _write_fitted(parent, out, child_cfg, fitted, extra, train_length)
    return result


def _write_fitted(parent: LoadedRun, out: Path, cfg: Config, model: GPT, extra: dict[str, Any], length: int) -> None:
    """Commit config + the fitted model's weights (+ the parent's tokenizer file) + meta as one checkpoint."""
    files = {MODEL_FILE: model_file_bytes(model), CONFIG_FILE: config_to_yaml(cfg).encode()}
    if "tokenizer.json" in parent.meta.files:
        files["tokenizer.json"] = read_verified(parent.path, parent.meta.files, "tokenizer.json")
    now = datetime.now(UTC).isoformat(timespec="seconds")
    commit_checkpoint(out, files, RunMeta.scaled_copy(parent.meta, train_length=length, extra=extra, now=now))


def at_edge(c: float, bounds: Sequence[float], step: float) -> bool:
    """Whether `c` lies within half a step of either end of the searched range `bounds` [lowest, highest]."""
    return c <= bounds[0] + step / 2 or c >= bounds[-1] - step / 2


def _recorded(result: CalibrateResult, meta: dict[str, Any]) -> CalibrateResult:
    """`result` filled from the child already there (the fit it recorded), status "already_complete"."""
    rec = recorded_extension(meta)
    temperature, done = rec.get("temperature") or {}, rec.get("result") or {}
    result.status = "already_complete"
    result.c, result.head_scale = temperature.get("c"), temperature.get("head_scale")
    result.loss_before = {int(k): v for k, v in (done.get("loss_before") or {}).items()}
    result.loss_after = {int(k): v for k, v in (done.get("loss_after") or {}).items()}
    result.history, result.at_edge = done.get("history") or [], bool(done.get("at_edge"))
    result.c_range, result.form = done.get("c_range"), temperature.get("form")
    result.seconds, result.data = float(done.get("seconds") or 0.0), done.get("data") or {}
    return result
