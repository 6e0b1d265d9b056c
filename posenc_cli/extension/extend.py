"""RoPE context extension of a checkpoint (`posenc extend`): frequency scaling plus an optional short fine-tune.

`extend_run` never modifies the source run. It writes a new run directory whose `config.yaml` records the scaling
under `pos.scaling` (method, factor, original length L and the method's parameters, all explicit), so `load_run` of
it builds the scaled model and `posenc eval-extrapolate` works on it unchanged. Without fine-tuning the weights file
is copied byte for byte (its sha256 stays the parent's); with `finetune_steps > 0` the scaled model is trained
further at L' (default factor·L) by `train.train`, which brings progress events, checkpoints and resume.

Metadata: `parent` = the parent run's absolute path, `base_length` = the parent's (the root run's training length),
`train_length` = the parent's (no fine-tune) or L', and `extend` = the settings record that makes a re-run
idempotent. Maths and defaults: `posenc_cli/rope_scaling/` (one file per method) and
../shared/reference/rope-scaling.md. YaRN's attention factor multiplies both cos and sin (logits scale by its
square), as in `transformers`. `dynamic` rescales per sequence length at run time (plain RoPE up to L), also while
fine-tuning at L'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import typing
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from posenc_cli import __version__
from posenc_cli.config import Config, ExtendConfig, config_to_yaml, nest_scaling_params, replace
from posenc_cli.errors import CheckpointError, ConfigError, UserError
from posenc_cli.extension.hf_extend import extend_hf_dir
from posenc_cli.extension.identity import differences
from posenc_cli.extension.limits import frequency_numbers
from posenc_cli.fsutil import exclusive_or_fail
from posenc_cli.positional.remap import RemapConfig, remapped_distance
from posenc_cli.positional.rope import rotary_dim
from posenc_cli.rope_scaling import RopeScalingConfig, method_names
from posenc_cli.run.device import threads as use_threads
from posenc_cli.run.hf_run import is_hf_dir
from posenc_cli.run.journal import commit_checkpoint
from posenc_cli.run.layout import CONFIG_FILE, MODEL_FILE
from posenc_cli.run.load import load_run
from posenc_cli.run.meta import RunMeta, is_run_dir, read_meta
from posenc_cli.run.outcome import ExtendResult
from posenc_cli.run.run_dir import check_claimable, claim_run_dir
from posenc_cli.run.train import train
from posenc_cli.run.verified import read_verified

if typing.TYPE_CHECKING:
    from posenc_cli.run.load import LoadedRun

__all__ = [
    "check_not_parent",
    "check_same_keys",
    "child_config",
    "default_out_dir",
    "existing_child",
    "extend_run",
    "extension_record",
    "finetune_length",
    "recorded_extension",
    "remap_logn_default",
    "remap_out_dir",
    "remap_run",
    "resolve_scaling",
    "validate_extend",
]

LOCK_FILE = ".extend.lock"  # held by the one `extend` writing an out directory (filelock; the loser changes nothing)
# Keys of the `extend` record that must match for a re-run to reuse (or resume) an existing child.
# Everything that changes the child's weights or numbers: the method and its parameters (LongRoPE's factors
# included), L, the fine-tune (steps, length, lr, warm-up, PoSE), the parent's weights, log-n, the remapping, and
# the LongRoPE search's settings and scored tokens (`longrope_search.search_identity`).
_IDENTITY_KEYS = ("method", "scaling", "finetune", "parent_weights_sha256", "logn", "remap", "search")

# ----------------------------------------------------------------------------------------------------------------
# Pure pieces.


def validate_extend(ext: ExtendConfig) -> None:
    """One-line `ConfigError` for an unknown method, factor <= 1 or a bad fine-tune setting."""
    if ext.method not in method_names():  # the registry's (posenc_cli/rope_scaling/)
        raise ConfigError(f"unknown scaling method '{ext.method}' (available: {', '.join(method_names())})")
    ext.validate()
    if ext.finetune_seq_len is not None and ext.finetune_seq_len < 2:
        raise ConfigError(f"extend.finetune_seq_len must be >= 2, got {ext.finetune_seq_len}")
    if ext.finetune_steps > 0 and not ext.finetune_lr > 0:
        raise ConfigError(f"extend.finetune_lr must be > 0, got {ext.finetune_lr}")


def require_rope(cfg: Config, run_dir: Path | str) -> None:
    """Frequency scaling applies to RoPE checkpoints only: one line otherwise."""
    if cfg.pos.name != "rope":
        raise ConfigError(
            f"{run_dir} uses pos={cfg.pos.name}; frequency scaling (extend) applies only to RoPE checkpoints"
        )


def check_not_parent(parent_dir: Path, out_dir: Path) -> None:
    """Refuse an output directory that is the parent run itself."""
    if out_dir.exists() and out_dir.resolve() == parent_dir.resolve():
        raise ConfigError(f"the output directory is the parent run {parent_dir}; extend never modifies its source")


def parent_train_length(cfg: Config, meta: RunMeta) -> int:
    """The checkpoint's training length (meta `train_length`; a fine-tuned child's is its L')."""
    return meta.lengths(cfg)[0]


def resolve_scaling(ext: ExtendConfig, parent_cfg: Config, parent_meta: RunMeta) -> RopeScalingConfig:
    """The child's `pos.scaling`: L = --original-length or the checkpoint's training length, always explicit.

    Explicit because a fine-tuned child trains at L' (its `train.seq_len`), and RoPE would otherwise take L' as L.
    """
    return RopeScalingConfig(
        method=ext.method,
        factor=float(ext.factor),
        original_length=ext.original_length or parent_train_length(parent_cfg, parent_meta),
        params=ext.params,
    )


def finetune_length(ext: ExtendConfig, original_length: int) -> int:
    """L' = --finetune-seq-len, or round(factor · L)."""
    return int(ext.finetune_seq_len) if ext.finetune_seq_len is not None else round(ext.factor * original_length)


def child_config(parent_cfg: Config, scaling: RopeScalingConfig, ext: ExtendConfig, threads: int = 0) -> Config:
    """The parent's config with `pos.scaling` set; with a fine-tune, `train` becomes the short run at L'.

    `threads` (the fine-tune's `train.threads`) is a runtime setting; without a fine-tune `train` is the parent's.
    Same data, tokenizer, batch size, precision and seed; steps = N, lr = finetune_lr, warm-up = finetune_warmup
    (the YaRN recipe scaled down: a short warm-up and a small learning rate). With `ext.pose` (PoSE) the fine-tune
    windows keep the original length L and their position ids skip-wise span L' (`train.pose_length`).
    """
    pos = replace(parent_cfg.pos, scaling=scaling)
    train = parent_cfg.train
    if ext.finetune_steps > 0:
        assert scaling.original_length is not None
        target = finetune_length(ext, scaling.original_length)
        train = replace(
            train,
            threads=threads,
            seq_len=scaling.original_length if ext.pose else target,
            steps=ext.finetune_steps,
            lr=ext.finetune_lr,
            warmup_steps=min(ext.finetune_warmup, ext.finetune_steps),
            random_positions=0,
            pose_length=target if ext.pose else 0,
            pose_chunks=ext.pose_chunks if ext.pose else train.pose_chunks,
        )
    model = parent_cfg.model
    if ext.logn:  # log-n attention scaling beyond the original length, on top of the frequency scaling
        model = replace(model, attn_scale="logn", logn_length=scaling.original_length)
    return replace(parent_cfg, model=model, pos=pos, train=train, extend=ext)


def extension_record(
    scaling: RopeScalingConfig,
    ext: ExtendConfig,
    parent_sha: str,
    parent_length: int,
    *,
    search: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """meta.json `extend`: the settings that identify the extension (`_IDENTITY_KEYS`) plus provenance."""
    assert scaling.original_length is not None
    finetune = None
    if ext.finetune_steps > 0:
        finetune = {
            "steps": ext.finetune_steps,
            "seq_len": finetune_length(ext, scaling.original_length),
            "lr": ext.finetune_lr,
            "warmup": ext.finetune_warmup,
        }
        if ext.pose:  # only then, so the records of earlier extensions stay what they were
            target = finetune["seq_len"]
            finetune.update(seq_len=scaling.original_length, pose_length=target, pose_chunks=ext.pose_chunks)
    record = {
        "method": scaling.method,
        "scaling": dataclasses.asdict(scaling),
        "finetune": finetune,
        "parent_weights_sha256": parent_sha,
        "parent_train_length": parent_length,
        "posenc_version": __version__,
    }
    if ext.logn:  # only then, so the records of earlier extensions stay what they were
        record["logn"] = {"length": scaling.original_length}
    if search is not None:  # LongRoPE's searched factors: the search's settings and the tokens it scored
        record["search"] = search
    return record


def default_out_dir(parent_dir: Path | str, ext: ExtendConfig) -> Path:
    """`<parent>-<method>x<factor>` next to the parent (plus `-ft<N>` with a fine-tune)."""
    parent = Path(parent_dir).resolve()
    name = f"{parent.name}-{ext.method}x{ext.factor:g}"
    if ext.finetune_steps > 0:
        name += f"-ft{ext.finetune_steps}" + ("-pose" if ext.pose else "")
    return parent.with_name(name + ("-logn" if ext.logn else ""))


def describe_scaling(scaling: Any) -> str:
    """'none' or e.g. 'yarn x4 (L=128)'."""
    if scaling is None or scaling.method == "none":
        return "none"
    return f"{scaling.method} x{scaling.factor:g} (L={scaling.original_length})"


def _frequency_numbers(
    scaling: RopeScalingConfig, rotary: int, base: float
) -> tuple[float, dict[str, int], tuple[float, float]]:
    """(attention factor, regions, longest wavelength before/after); ConfigError for bad parameters and for a
    factor out of the method's range (`limits.frequency_numbers`)."""
    assert scaling.original_length is not None
    return frequency_numbers(
        scaling.method, rotary, base, scaling.factor, scaling.original_length, **scaling.param_values()
    )


# ----------------------------------------------------------------------------------------------------------------
# The out directory: absent, empty, an earlier attempt at the same extension, or something else.


def existing_child(out_dir: Path) -> dict[str, Any] | None:
    """meta.json of a posenc run in `out_dir`; None when absent, empty or posenc's unfinished attempt (claimed);
    ConfigError when it holds anything else."""
    if not out_dir.exists():
        return None
    if not out_dir.is_dir():
        raise ConfigError(f"output directory {out_dir} exists and is not a directory")
    if is_run_dir(out_dir):
        return read_meta(out_dir)
    try:
        check_claimable(out_dir)
    except CheckpointError as e:
        raise ConfigError(f"output directory {out_dir} exists and is not empty; choose another --out") from e
    return None


def _is_complete(out_dir: Path, meta: dict[str, Any]) -> bool:
    """A copied child is complete when its meta says so and every file it lists is there and verifies (a directory
    holding only meta.json, as a killed or raced writer could leave, is redone, not reported as done)."""
    if meta.get("status") != "complete":
        return False
    try:
        for name in meta["files"]:
            read_verified(out_dir, meta["files"], name)
    except (CheckpointError, OSError):
        return False
    return True


@contextlib.contextmanager
def _writer_lock(out_dir: Path) -> Iterator[None]:
    """Hold `out_dir`'s extend lock, or refuse at once: a second `extend` into the same directory changes nothing."""
    message = f"{out_dir} is being written by another posenc extend; nothing was changed"
    with exclusive_or_fail(out_dir / LOCK_FILE, lambda: UserError(message)):
        yield


def _check_out_dir(out: Path, record: dict[str, Any], resume: bool) -> dict[str, Any] | None:
    """The meta of this same extension already in `out` (None: nothing there yet); refuses anything else."""
    existing = existing_child(out)
    if existing is not None:
        _check_same_extension(out, existing, record)
    elif resume:
        raise CheckpointError(f"{out} holds no extension to resume")
    return existing


def _check_same_extension(out_dir: Path, meta: dict[str, Any], record: dict[str, Any]) -> None:
    check_same_keys(out_dir, meta, record, _IDENTITY_KEYS)


def recorded_extension(meta: dict[str, Any]) -> Any:
    """meta.json's `extend` record in today's layout: a `scaling` recorded flat by earlier versions (every method's
    parameters beside `method`) nested as `config.yaml` now holds it, so an old child compares equal to the same
    extension asked again (`config.nest_scaling_params`)."""
    old = meta.get("extend")
    scaling = old.get("scaling") if isinstance(old, dict) else None
    if isinstance(scaling, dict) and "params" not in scaling:
        with contextlib.suppress(ConfigError):  # not a scaling this version knows: it differs, as it is
            old = {**old, "scaling": nest_scaling_params(RopeScalingConfig, scaling, "extend.scaling")}
    return old


def check_same_keys(out_dir: Path, meta: dict[str, Any], record: dict[str, Any], keys: Sequence[str]) -> None:
    """Refuse, in one line naming what differs, a child (`meta`) whose extension record differs from `record` in
    `keys` (the LongRoPE search checks its own part before searching)."""
    old = recorded_extension(meta)
    if not isinstance(old, dict):
        raise ConfigError(
            f"output directory {out_dir} already holds a run that is not an extension; choose another --out"
        )
    diffs = [k for k in keys if old.get(k) != record.get(k)]
    if diffs:
        what = "parent weights" if diffs == ["parent_weights_sha256"] else "; ".join(differences(old, record, keys))
        raise ConfigError(
            f"output directory {out_dir} already holds a different extension (other {what}); choose another --out"
        )


# ----------------------------------------------------------------------------------------------------------------
# The entry point.


def extend_run(
    parent_dir: Path | str,
    out_dir: Path | str,
    ext: ExtendConfig,
    *,
    threads: int = 0,
    callback: Callable[[dict[str, Any]], None] | None = None,
    resume: bool = False,
    search: dict[str, Any] | None = None,
) -> ExtendResult:
    """Write the RoPE-scaled child of run `parent_dir` into `out_dir` (fine-tuning it when `ext.finetune_steps`).

    Idempotent: when `out_dir` already holds this extension of these parent weights, a complete child is returned
    as is (status "already_complete") and an interrupted fine-tune is resumed. `out_dir` may exist if empty.
    Refused with a one-line `UserError`, before anything is written: an unknown method, factor <= 1, a parent that
    is not a verified posenc run or not RoPE, and an `out_dir` that is the parent or holds anything else.
    `resume=True` additionally requires `out_dir` to hold the extension already. `callback` receives `train()`'s
    events during a fine-tune; `threads` sets the fine-tune's `train.threads` (0 = torch's default). `search`: the
    LongRoPE search that found `ext`'s factors (`longrope_search.search_identity`), recorded as `extend.search`.
    """
    validate_extend(ext)
    parent_path, out = Path(parent_dir), Path(out_dir)
    check_not_parent(parent_path, out)

    # a transformers directory: a new transformers directory (posenc_cli/extension/hf_extend.py)
    if is_hf_dir(parent_path):
        if ext.logn:
            raise ConfigError("--logn applies to posenc runs only; transformers directories have no log-n option")

        return extend_hf_dir(parent_path, out, ext)
    with use_threads(threads):
        parent = load_run(parent_path)
    cfg = parent.config
    require_rope(cfg, parent_path)
    if ext.logn and cfg.model.attn_scale != "none":
        raise ConfigError(f"{parent_path} already scales attention logits (model.attn_scale={cfg.model.attn_scale})")
    scaling = resolve_scaling(ext, cfg, parent.meta)
    rotary = rotary_dim(cfg.model.head_dim, cfg.pos.rotary_fraction)  # type: ignore[attr-defined]
    attention, regions, wavelengths = _frequency_numbers(scaling, rotary, cfg.pos.base)  # type: ignore[attr-defined]
    parent_length, base_length = parent.meta.lengths(cfg)
    record = extension_record(scaling, ext, str(parent.meta.files[MODEL_FILE]), parent_length, search=search)
    child_cfg = child_config(cfg, scaling, ext, threads)

    _check_out_dir(out, record, resume)  # refuses a user's directory before the lock is written into it
    with _writer_lock(out):
        existing = _check_out_dir(out, record, resume)  # again under the lock: another writer may have finished
        if existing is None:
            claim_run_dir(out)

        result = ExtendResult(
            parent_dir=parent_path,
            out_dir=out,
            status="created",
            method=scaling.method,
            factor=scaling.factor,
            original_length=int(scaling.original_length or parent_length),
            attention_factor=attention,
            rotary_dim=rotary,
            base=float(cfg.pos.base),  # type: ignore[attr-defined]
            regions=regions,
            longest_wavelength=wavelengths,
            parent_scaling=describe_scaling(getattr(cfg.pos, "scaling", None)),
            parent_train_length=parent_length,
            base_length=base_length,
            train_length=child_cfg.train.seq_len if ext.finetune_steps > 0 else parent_length,
        )
        extra = {"parent": str(parent_path.resolve()), "base_length": base_length, "extend": record}
        if ext.finetune_steps > 0:
            res = train(child_cfg, out, init_from=parent_path, meta_extra=extra, callback=callback)
            result.finetune = res
            if res.stopped_reason == "complete":
                result.status = "finetuned"
            elif res.stopped_reason == "already_complete":
                result.status = "already_complete"
            else:
                result.status = "interrupted"
            return result
        if existing is not None and _is_complete(out, existing):
            result.status = "already_complete"
            return result
        _write_scaled_copy(parent, out, child_cfg, extra, parent_length)
        return result


def _write_scaled_copy(
    parent: LoadedRun, out: Path, child_cfg: Config, extra: dict[str, Any], train_length: int
) -> None:
    """Commit config + byte-identical weights (+ tokenizer file) + meta as one checkpoint (see checkpoint.py)."""
    files = {
        MODEL_FILE: read_verified(parent.path, parent.meta.files, MODEL_FILE),  # checked against the parent's sha256
        CONFIG_FILE: config_to_yaml(child_cfg).encode(),
    }
    if "tokenizer.json" in parent.meta.files:
        files["tokenizer.json"] = read_verified(parent.path, parent.meta.files, "tokenizer.json")
    now = datetime.now(UTC).isoformat(timespec="seconds")
    meta = RunMeta.scaled_copy(parent.meta, train_length=train_length, extra=extra, now=now)
    commit_checkpoint(out, files, meta)


# ----------------------------------------------------------------------------------------------------------------
# Position remapping (Self-Extend, ReRoPE): no new frequencies and no training, only `pos.remap` in the child.


@dataclasses.dataclass
class RemapResult:
    """What `remap_run` did: the directories, the remapping, and the largest relative position at a few lengths."""

    parent_dir: Path
    out_dir: Path
    status: str  # "created" or "already_complete"
    remap: RemapConfig
    parent_scaling: str
    train_length: int
    base_length: int
    largest_distance: dict[int, float]  # tokens -> the largest relative position the model sees at that length
    logn_length: int | None = None  # L of the log-n query scaling the child adds (None: none added)


def remap_logn_default(method: str) -> bool:
    """Whether a remapping scales queries by log-n unless told otherwise: as its reference does.

    ReRoPE and Leaky ReRoPE: yes. bojone/rerope (acfe788) `rerope_patch.py:56` and `leaky_rerope_patch.py:61`
    multiply every query, before either rotation (so both the windowed and the rectified score), by
    max(1, log(position_id + 1) / log(training_length)): posenc's `model.attn_scale=logn` with `model.logn_length`
    = the parent's training length, applied to q before the rotations as well (`CausalSelfAttention.qkv_heads`).
    Self-Extend: no. datamllab/LongLM (cdbbb06) has the same log-n as an option that is off by default:
    `SelfExtend.apply(..., scale_base=-1)` (SelfExtend.py:67; "base for the scale, equal to pretraining length"),
    applied to the query before both the neighbour and the grouped rotation (`self_extend_patch/Llama_4_40.py:108`);
    `--logn` is that option with scale_base = the parent's training length (recorded in the child's config, meta
    and directory name).
    """
    return method == "rerope"


def remap_out_dir(parent_dir: Path | str, remap: RemapConfig, logn: bool | None = None) -> Path:
    """`<parent>-self-extend-w<W>g<G>`, `<parent>-rerope-w<W>` or `<parent>-rerope-w<W>k<k>` next to the parent,
    plus `-logn` (Self-Extend with log-n) or `-nologn` (ReRoPE without) when log-n is not the method's default."""
    parent = Path(parent_dir).resolve()
    tail = f"g{remap.group}" if remap.method == "self-extend" else (f"k{remap.leaky:g}" if remap.leaky else "")
    default = remap_logn_default(remap.method)
    on = default if logn is None else logn
    tail += "" if on == default else ("-logn" if on else "-nologn")
    return parent.with_name(f"{parent.name}-{remap.method}-w{remap.window}{tail}")


def remap_run(
    parent_dir: Path | str,
    out_dir: Path | str,
    remap: RemapConfig,
    *,
    threads: int = 0,
    logn: bool | None = None,
) -> RemapResult:
    """Write the child of RoPE run `parent_dir` that remaps positions as `remap` says (its config's `pos.remap`;
    weights, tokenizer and everything else the parent's), with log-n query scaling (`model.attn_scale=logn`,
    L = the parent's training length) when `logn`, by default as the method's reference (`remap_logn_default`).
    Idempotent like `extend_run`. Refused with a one-line `UserError` before anything is written: bad settings, a
    transformers directory, a parent that is not RoPE or already remaps, `logn` asked of a parent that already
    scales its logits, an `out_dir` that is the parent or holds anything else."""
    if remap.method == "none":
        raise ConfigError("give a remapping method: self-extend or rerope")
    remap.validate()
    parent_path, out = Path(parent_dir), Path(out_dir)
    check_not_parent(parent_path, out)
    if is_hf_dir(parent_path):
        raise ConfigError(f"{remap.method} applies to posenc runs only; transformers directories have no remapping")
    with use_threads(threads):
        parent = load_run(parent_path)
    cfg = parent.config
    if cfg.pos.name != "rope":
        raise ConfigError(
            f"{parent_path} uses pos={cfg.pos.name}; {remap.method} remaps RoPE positions and applies only to RoPE "
            "checkpoints"
        )
    if cfg.pos.remap.active:  # type: ignore[attr-defined]
        raise ConfigError(f"{parent_path} already remaps positions ({cfg.pos.remap.describe()})")  # type: ignore[attr-defined]
    if logn and cfg.model.attn_scale != "none":
        raise ConfigError(f"{parent_path} already scales attention logits (model.attn_scale={cfg.model.attn_scale})")
    parent_length, base_length = parent.meta.lengths(cfg)
    # by default as the reference; a parent that already scales its logits keeps its own scaling (config shows it)
    add_logn = logn if logn is not None else remap_logn_default(remap.method) and cfg.model.attn_scale == "none"
    record: dict[str, Any] = {
        "method": remap.method,
        "scaling": None,
        "remap": dataclasses.asdict(remap),
        "finetune": None,
        "parent_weights_sha256": str(parent.meta.files[MODEL_FILE]),
        "parent_train_length": parent_length,
        "posenc_version": __version__,
    }
    model = cfg.model
    if add_logn:
        record["logn"] = {"length": parent_length}
        model = replace(model, attn_scale="logn", logn_length=parent_length)
    child_cfg = replace(cfg, model=model, pos=replace(cfg.pos, remap=remap))
    lengths = [m * parent_length for m in (1, 4, 16)]
    result = RemapResult(
        parent_dir=parent_path,
        out_dir=out,
        status="created",
        remap=remap,
        parent_scaling=describe_scaling(getattr(cfg.pos, "scaling", None)),
        train_length=parent_length,
        base_length=base_length,
        largest_distance={n: remapped_distance(remap, n - 1, 0) for n in lengths},
        logn_length=parent_length if add_logn else None,
    )
    _check_out_dir(out, record, resume=False)
    with _writer_lock(out):
        existing = _check_out_dir(out, record, resume=False)
        if existing is not None and _is_complete(out, existing):
            result.status = "already_complete"
            return result
        if existing is None:
            claim_run_dir(out)
        extra = {"parent": str(parent_path.resolve()), "base_length": base_length, "extend": record}
        _write_scaled_copy(parent, out, child_cfg, extra, parent_length)
        return result
