"""What an extension's settings may be, and the refusals that need no checkpoint: none of it imports torch.

`extension.plan` checks a request with these while planning, and `plan.execute` checks the parent with
`check_parent` before it imports the code that loads a checkpoint (and torch), so a user error is one line before
anything costly: an unknown method, factor <= 1, a bad fine-tune, layer rule or search setting (`validate_extend`,
`check_search_settings`; a remapping's settings are `config.RemapConfig`'s, as torch-free), and a parent that does
not exist, is neither a posenc run nor a transformers directory, did not finish training, or is the output directory.
`extend_run`, `remap_run` and `searched_factors` start with the same checks, so called directly they refuse alike.
The default output directories are named here too (`default_out_dir`, `remap_out_dir`). `calibrate` checks its
parent with `check_parent` as well (`extension.calibrate_settings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from posenc_cli.config import ExtendConfig, RemapConfig
from posenc_cli.errors import ConfigError
from posenc_cli.rope_scaling import method_names
from posenc_cli.run.meta import is_hf_dir, read_meta, require_complete

__all__ = [
    "LAYER_RULES",
    "LayerRule",
    "check_not_parent",
    "check_parent",
    "check_search_settings",
    "default_out_dir",
    "finetune_length",
    "remap_logn_default",
    "remap_out_dir",
    "validate_extend",
]

LayerRule = Literal["global", "all"]  # which RoPE layers of a layout an extension changes (`rope_layers`)
LAYER_RULES: tuple[LayerRule, ...] = ("global", "all")


def validate_extend(ext: ExtendConfig) -> None:
    """One-line `ConfigError` for an unknown method, factor <= 1 or a bad fine-tune setting."""
    if ext.method not in method_names():  # the registry's (posenc_cli/rope_scaling/)
        raise ConfigError(f"unknown scaling method '{ext.method}' (available: {', '.join(method_names())})")
    ext.validate()
    if ext.layers not in LAYER_RULES:
        raise ConfigError(f"extend.layers must be one of {', '.join(LAYER_RULES)}, got {ext.layers!r}")
    if ext.finetune_seq_len is not None and ext.finetune_seq_len < 2:
        raise ConfigError(f"extend.finetune_seq_len must be >= 2, got {ext.finetune_seq_len}")
    if ext.finetune_steps > 0 and not ext.finetune_lr > 0:
        raise ConfigError(f"extend.finetune_lr must be > 0, got {ext.finetune_lr}")


def check_search_settings(budget: int, tokens: int) -> None:
    """One line for a LongRoPE search budget or a token count below 1."""
    if budget < 1:
        raise ConfigError(f"--search-budget must be >= 1, got {budget}")
    if tokens < 1:
        raise ConfigError(f"--search-tokens must be >= 1, got {tokens}")


def finetune_length(ext: ExtendConfig, original_length: int) -> int:
    """L' = --finetune-seq-len, or round(factor · L)."""
    return int(ext.finetune_seq_len) if ext.finetune_seq_len is not None else round(ext.factor * original_length)


def default_out_dir(parent_dir: Path | str, ext: ExtendConfig) -> Path:
    """`<parent>-<method>x<factor>` next to the parent (plus `-ft<N>` with a fine-tune)."""
    parent = Path(parent_dir).resolve()
    name = f"{parent.name}-{ext.method}x{ext.factor:g}"
    if ext.finetune_steps > 0:
        name += f"-ft{ext.finetune_steps}" + ("-pose" if ext.pose else "")
    return parent.with_name(name + ("-logn" if ext.logn else ""))


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


def check_not_parent(parent_dir: Path, out_dir: Path) -> None:
    """Refuse an output directory that is the parent run itself."""
    if out_dir.exists() and out_dir.resolve() == parent_dir.resolve():
        raise ConfigError(f"the output directory is the parent run {parent_dir}; extend never modifies its source")


def check_parent(
    parent_dir: Path, out_dir: Path | None, *, logn: bool = False, remap: str | None = None, search: bool = False
) -> bool:
    """True when `parent_dir` is a transformers directory, False when it is a posenc run that finished training.

    One line, reading only meta.json, when `out_dir` is the parent (`check_not_parent`; None: a default directory
    named beside the parent, which never is), the parent does not exist, is neither (`run.meta.read_meta`), did not
    finish training (`run.meta.require_complete`, as `load_run` checks), or is a transformers directory asked for
    what only a posenc run has: log-n (`logn`), a remapping (`remap`: its method) or LongRoPE's search (`search`)."""
    if out_dir is not None:
        check_not_parent(parent_dir, out_dir)
    if is_hf_dir(parent_dir):
        if remap is not None:
            raise ConfigError(f"{remap} applies to posenc runs only; transformers directories have no remapping")
        if search:
            raise ConfigError("--search needs a posenc run (it scores candidates on the run's own training data)")
        if logn:
            raise ConfigError("--logn applies to posenc runs only; transformers directories have no log-n option")
        return True
    require_complete(read_meta(parent_dir), parent_dir)
    return False
