"""Export a run to a `transformers` model directory (config.json + model.safetensors + tokenizer), no remote code.

posenc's block is GPT-2's pre-norm block (LayerNorm, fused QKV, exact-erf GELU MLP, tied embeddings), so:
- `learned` runs become GPT-2 (`GPT2LMHeadModel`): `wpe` is the learned table (n_positions = its L rows); GPT-2's
  `Conv1D` stores weights as (in, out), the transpose of `nn.Linear`; c_attn keeps posenc's q, k, v row order.
- `rope` runs become GPT-NeoX (`GPTNeoXForCausalLM`) with `use_parallel_residual=False` (x + attn(ln(x)), then
  x + mlp(ln(x))), `partial_rotary_factor` = rotary dim / head dim and NeoX's rotate_half pairing. NeoX fuses QKV
  per head ([q_h, k_h, v_h] for each head h), so posenc's [q, k, v] rows are regrouped; an `interleaved` run's q/k
  rows are also permuted within each head's rotary dims (pair (2k, 2k+1) -> (k, k + d/2): the same rotation).
  RoPE scaling maps onto `transformers`' rope parameters by each method's `transformers` hook
  (posenc_cli/rope_scaling/<method>.py): linear, dynamic, yarn and llama3 by name, with the original length L as
  `original_max_position_embeddings` (dynamic reads L from `max_position_embeddings`), and static NTK as plain RoPE
  with base' = base·s^(d/(d-2)). YaRN's attention factor multiplies cos and sin in both.
- RMSNorm RoPE runs and per-layer layouts of RoPE and NoPE layers (full or sliding attention: `smollm3`,
  `rnope-swa`, `pos=layout`) become SmolLM3 (`SmolLM3ForCausalLM`), exactly (`run.export_smollm3`, which says
  why no architecture holds posenc's LayerNorm block with per-layer NoPE or windows, and refuses the rest).
- The same runs with learned attention sinks (`model.attn_sinks`, `pos=gpt-oss`) become Granite SWA
  (`GraniteSWAForCausalLM`), exactly (`run.export_granite`, which also says why the other model options, QK-norm,
  the output gate and Canon layers, have no exact target and are refused).
- Every other scheme is refused with `NotExportable` before anything is written.
Missing biases (`model.bias=false`) are written as zeros, which is exact. The tokenizer is exported as a
`tokenizers` JSON that `AutoTokenizer` loads: byte runs get a byte-level model whose ids are the byte values and
256 = `<|endoftext|>`; BPE runs get their own tokenizer. After writing, the directory is loaded back with
`AutoModelForCausalLM.from_pretrained` and its logits are compared with posenc's before it is moved into place.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import safetensors.torch
import torch
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from torch import Tensor

from posenc_cli import __version__
from posenc_cli.config import Config
from posenc_cli.data.tokenizer import EOD_TOKEN
from posenc_cli.errors import ConfigError, NotExportable, UserError
from posenc_cli.fsutil import make_temp_dir, set_default_mode
from posenc_cli.positional.layout import LayoutConfig
from posenc_cli.positional.rope import rotary_dim
from posenc_cli.run.export_granite import ARCHITECTURE as GRANITE_SWA  # runs with learned sinks
from posenc_cli.run.export_granite import (
    check_granite_exportable,
    granite_config_kwargs,
    granite_weights,
    option_refusal,
    takes_granite,
)
from posenc_cli.run.export_rope import interleaved_to_half, neox_rope
from posenc_cli.run.export_smollm3 import check_smollm3_exportable, smollm3_config_kwargs, smollm3_weights
from posenc_cli.run.journal import fsync_dir
from posenc_cli.run.load import load_run

if TYPE_CHECKING:
    from posenc_cli.run.load import LoadedRun

__all__ = [
    "ARCHITECTURES",
    "ExportResult",
    "byte_level_alphabet",
    "check_exportable",
    "export_run",
    "gpt2_weights",
    "hf_config_kwargs",
    "hf_tokenizer",
    "neox_qkv_rows",
    "neox_weights",
]

ARCHITECTURES = {"learned": "GPT2LMHeadModel", "rope": "GPTNeoXForCausalLM"}
SMOLLM3 = "SmolLM3ForCausalLM"  # RMSNorm RoPE runs and per-layer layouts of RoPE/NoPE (`run.export_smollm3`)
EXPORT_INFO_FILE = "posenc_export.json"
VERIFY_MAX_TOKENS = 256
VERIFY_RTOL = 1e-4  # max |Δlogit| / max(1, max |logit|) allowed by the built-in check
_INSTALL_HINT = "pip install 'posenc[hf]'"


@dataclass
class ExportResult:
    run_dir: Path
    out_dir: Path
    scheme: str
    architecture: str
    step: int
    tokenizer: str  # "byte" or "bpe"
    rope_type: str | None  # rope runs: default|linear|dynamic|yarn|llama3 (static NTK exports as default)
    rope_scaling: dict[str, Any] | None  # the rope scaling parameters written (None: plain RoPE or not RoPE)
    max_length: int | None  # positions the exported model serves (learned: the table size); None: unlimited
    files: list[str] = field(default_factory=list)
    verify_tokens: int | None = None
    max_abs_diff: float | None = None  # max |logit_hf - logit_posenc| of the check; None when skipped


# ----------------------------------------------------------------------------------------------------------------
# What is exportable.


def architecture(cfg: Config) -> str | None:
    """The transformers architecture a run is exported as: Granite SWA for runs with learned sinks; SmolLM3 for
    RMSNorm runs of RoPE and for every per-layer layout (`run.export_smollm3` decides whether it holds the layout),
    else `ARCHITECTURES`' entry (None: none)."""
    if takes_granite(cfg):
        return GRANITE_SWA
    if isinstance(cfg.pos, LayoutConfig) or (cfg.pos.name == "rope" and cfg.model.norm == "rmsnorm"):
        return SMOLLM3
    return ARCHITECTURES.get(cfg.pos.name)


def check_exportable(cfg: Config) -> None:
    """Raise `NotExportable` (one line) unless the run maps exactly onto GPT-2, GPT-NeoX, SmolLM3 or Granite SWA."""
    reason = option_refusal(cfg)  # model options: only sinks have an exact target (`run.export_granite`)
    if reason is not None:
        raise NotExportable(reason)
    if architecture(cfg) == GRANITE_SWA:
        check_granite_exportable(cfg)
        return
    if architecture(cfg) == SMOLLM3:
        check_smollm3_exportable(cfg)
        return
    scheme = cfg.pos.name
    if scheme not in ARCHITECTURES:
        raise NotExportable(
            f"not exportable: no matching architecture in transformers for pos={scheme} "
            f"(exportable: {', '.join(f'{k} -> {v}' for k, v in ARCHITECTURES.items())})"
        )
    if cfg.model.norm != "layernorm":
        raise NotExportable(
            f"not exportable: model.norm={cfg.model.norm} has no matching architecture in transformers "
            f"({ARCHITECTURES[scheme]} uses LayerNorm; train with model.norm=layernorm)"
        )  # a RoPE run with RMSNorm: SmolLM3, above
    if (p := getattr(cfg.pos, "p", 1.0)) != 1.0:
        raise NotExportable(f"not exportable: pos.p={p} (p-RoPE) has no counterpart in {ARCHITECTURES[scheme]}")
    if (remap := getattr(cfg.pos, "remap", None)) is not None and remap.active:
        raise NotExportable(
            f"not exportable: pos.remap ({remap.describe()}) has no counterpart in {ARCHITECTURES[scheme]}"
        )
    if cfg.model.attn_scale != "none":
        raise NotExportable(
            f"not exportable: model.attn_scale={cfg.model.attn_scale} (attention-logit length scaling) has no "
            f"counterpart in {ARCHITECTURES[scheme]}"
        )
    if cfg.model.embedding != "gpt2":
        raise NotExportable(
            f"not exportable: model.embedding={cfg.model.embedding} scales token embeddings by √D, which "
            f"{ARCHITECTURES[scheme]} does not (train with model.embedding=gpt2)"
        )


# ----------------------------------------------------------------------------------------------------------------
# Configs (keyword arguments of the transformers config classes; legacy names that 4.x and 5.x both accept).


def hf_config_kwargs(cfg: Config, vocab_size: int, eod_id: int, table_length: int | None) -> dict[str, Any]:
    """Keyword arguments of `GPT2Config` (learned) or `GPTNeoXConfig` (rope) for this run."""
    m = cfg.model
    common = {"vocab_size": vocab_size, "bos_token_id": eod_id, "eos_token_id": eod_id, "tie_word_embeddings": True}
    if cfg.pos.name == "learned":
        assert table_length is not None
        return {
            **common,
            "n_embd": m.d_model,
            "n_layer": m.n_layer,
            "n_head": m.n_head,
            "n_inner": m.mlp_ratio * m.d_model,
            "n_positions": table_length,
            "activation_function": "gelu",  # exact erf GELU (nn.GELU()); GPT-2's default "gelu_new" is the tanh one
            "layer_norm_epsilon": 1e-5,
            "resid_pdrop": m.dropout,
            "embd_pdrop": m.dropout,
            "attn_pdrop": m.dropout,
            "initializer_range": m.init_std,
            "scale_attn_weights": True,  # 1/√hd, as SDPA
        }
    scaling, base, partial, max_pos = neox_rope(cfg.pos, m.head_dim, cfg.train.seq_len)  # type: ignore[arg-type]
    return {
        **common,
        "hidden_size": m.d_model,
        "num_hidden_layers": m.n_layer,
        "num_attention_heads": m.n_head,
        "intermediate_size": m.mlp_ratio * m.d_model,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-5,
        "use_parallel_residual": False,
        "rotary_pct": partial,
        "rotary_emb_base": base,
        "rope_scaling": scaling,
        "max_position_embeddings": max_pos,
        "attention_bias": True,
        "hidden_dropout": m.dropout,
        "attention_dropout": m.dropout,
        "initializer_range": m.init_std,
    }


# ----------------------------------------------------------------------------------------------------------------
# Weights.


def _get(state: dict[str, Tensor], name: str, like: Tensor, rows: int | None = None) -> Tensor:
    """`state[name]`, or zeros (a missing bias of a bias=False model: adding zeros is exact)."""
    if name in state:
        return state[name]
    return torch.zeros(rows if rows is not None else like.shape[0], dtype=like.dtype)


def _norm(state: dict[str, Tensor], src: str, dst: str) -> dict[str, Tensor]:
    w = state[f"{src}.weight"]
    return {f"{dst}.weight": w, f"{dst}.bias": _get(state, f"{src}.bias", w)}


def _linear(state: dict[str, Tensor], src: str, dst: str, *, conv1d: bool = False) -> dict[str, Tensor]:
    """nn.Linear weight (out, in) -> itself, or GPT-2 Conv1D's (in, out) when `conv1d`; bias zero-filled."""
    w = state[f"{src}.weight"]
    b = _get(state, f"{src}.bias", w)
    return {f"{dst}.weight": w.t().contiguous() if conv1d else w, f"{dst}.bias": b}


def gpt2_weights(state: dict[str, Tensor], n_layer: int) -> dict[str, Tensor]:
    """posenc state dict of a `learned` run -> GPT2LMHeadModel state dict (lm_head tied to wte, not stored)."""
    out = {"transformer.wte.weight": state["wte.weight"], "transformer.wpe.weight": state["scheme.wpe.weight"]}
    for i in range(n_layer):
        src, dst = f"blocks.{i}", f"transformer.h.{i}"
        out.update(_norm(state, f"{src}.norm1", f"{dst}.ln_1"))
        out.update(_linear(state, f"{src}.attn.qkv", f"{dst}.attn.c_attn", conv1d=True))  # q, k, v: same order
        out.update(_linear(state, f"{src}.attn.proj", f"{dst}.attn.c_proj", conv1d=True))
        out.update(_norm(state, f"{src}.norm2", f"{dst}.ln_2"))
        out.update(_linear(state, f"{src}.mlp.fc", f"{dst}.mlp.c_fc", conv1d=True))
        out.update(_linear(state, f"{src}.mlp.proj", f"{dst}.mlp.c_proj", conv1d=True))
    out.update(_norm(state, "norm_f", "transformer.ln_f"))
    return out


def neox_qkv_rows(n_head: int, head_dim: int, rotary_dim: int, interleaved: bool) -> Tensor:
    """(3·D,) indices into posenc's fused qkv rows [q | k | v] giving NeoX's per-head [q_h, k_h, v_h] order."""
    rows = torch.arange(3 * n_head * head_dim).view(3, n_head, head_dim)  # (3, H, hd): posenc row of (part, h, j)
    if interleaved:
        perm = interleaved_to_half(rotary_dim)
        rows[:2, :, :rotary_dim] = rows[:2, :, :rotary_dim][..., perm]  # q and k only; v is never rotated
    return rows.transpose(0, 1).reshape(-1)  # (H, 3, hd) -> (3·D,)


def neox_weights(state: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    """posenc state dict of a `rope` run -> GPTNeoXForCausalLM state dict (the LM head tied, not stored)."""
    m = cfg.model
    order = neox_qkv_rows(
        m.n_head, m.head_dim, rotary_dim(m.head_dim, cfg.pos.rotary_fraction), cfg.pos.layout == "interleaved"
    )
    out = {"gpt_neox.embed_in.weight": state["wte.weight"]}
    for i in range(m.n_layer):
        src, dst = f"blocks.{i}", f"gpt_neox.layers.{i}"
        out.update(_norm(state, f"{src}.norm1", f"{dst}.input_layernorm"))
        qkv = _linear(state, f"{src}.attn.qkv", f"{dst}.attention.query_key_value")
        out.update({k: v[order] for k, v in qkv.items()})
        out.update(_linear(state, f"{src}.attn.proj", f"{dst}.attention.dense"))
        out.update(_norm(state, f"{src}.norm2", f"{dst}.post_attention_layernorm"))
        out.update(_linear(state, f"{src}.mlp.fc", f"{dst}.mlp.dense_h_to_4h"))
        out.update(_linear(state, f"{src}.mlp.proj", f"{dst}.mlp.dense_4h_to_h"))
    out.update(_norm(state, "norm_f", "gpt_neox.final_layer_norm"))
    return out


# ----------------------------------------------------------------------------------------------------------------
# Tokenizer.


def byte_level_alphabet() -> list[str]:
    """The character standing for each byte 0..255 in byte-level BPE (GPT-2's printable byte map).

    Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68 bytes map, in order,
    to U+0100, U+0101, ...
    """
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    out, extra = [], 0
    for b in range(256):  # the 256 byte values, once
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(0x100 + extra))
            extra += 1
    return out


def _byte_tokenizer_json() -> str:
    """A `tokenizers` byte-level model with ids = byte values and 256 = <|endoftext|> (posenc's byte tokenizer)."""
    vocab = {ch: b for b, ch in enumerate(byte_level_alphabet())}
    vocab[EOD_TOKEN] = 256
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per byte
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOD_TOKEN, special=True)])
    return tok.to_str()


def hf_tokenizer(tokenizer: Any, model_max_length: int | None) -> Any:
    """A `transformers` fast tokenizer for posenc's byte or BPE tokenizer (no BOS is added, as in training)."""
    from transformers import PreTrainedTokenizerFast  # optional (the [hf] extra): see _require_transformers

    raw = _byte_tokenizer_json() if tokenizer.kind == "byte" else tokenizer.to_json()
    kwargs: dict[str, Any] = {"eos_token": EOD_TOKEN}
    if model_max_length is not None:
        kwargs["model_max_length"] = model_max_length
    return PreTrainedTokenizerFast(tokenizer_object=HFTokenizer.from_str(raw), **kwargs)


# ----------------------------------------------------------------------------------------------------------------
# The export.


def _require_transformers() -> Any:
    """`transformers`, an optional dependency (the [hf] extra), or a one-line refusal naming the install command;
    the functions that use it import it where they run, after this check."""
    try:
        import transformers
    except ImportError as e:
        raise UserError(f"posenc export --to hf needs the transformers package: {_INSTALL_HINT}") from e
    return transformers


def _check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"--out {out} exists and is not empty; choose a new directory")


def verify_export(run: LoadedRun, hf_dir: Path, length: int, seed: int = 0) -> tuple[float, float]:
    """(max |Δlogit|, max |logit|) of posenc vs `AutoModelForCausalLM.from_pretrained(hf_dir)` on random ids."""
    from transformers import AutoModelForCausalLM  # optional (the [hf] extra): see _require_transformers

    hf = AutoModelForCausalLM.from_pretrained(str(hf_dir)).float().eval()
    ids = torch.randint(0, run.tokenizer.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ours = run.model(ids).float()  # (1, T, V)
        theirs = hf(input_ids=ids).logits.float()  # (1, T, V)
    return float((ours - theirs).abs().max()), float(ours.abs().max())


def _write(run: LoadedRun, directory: Path, transformers: Any) -> tuple[dict[str, Any] | None, int | None]:
    """Write config.json, model.safetensors, the tokenizer and posenc_export.json; returns (rope_scaling, table)."""
    cfg = run.config
    state = {k: v.detach().cpu().float().contiguous() for k, v in run.model.state_dict().items()}
    table = int(state["scheme.wpe.weight"].shape[0]) if cfg.pos.name == "learned" else None
    target = architecture(cfg)
    if target == GRANITE_SWA:
        kwargs = granite_config_kwargs(cfg, run.tokenizer.vocab_size, run.tokenizer.eod_id)
        hf_cfg, weights = transformers.GraniteSWAConfig(**kwargs), granite_weights(state, cfg)
    elif target == SMOLLM3:
        kwargs = smollm3_config_kwargs(cfg, run.tokenizer.vocab_size, run.tokenizer.eod_id)
        hf_cfg, weights = transformers.SmolLM3Config(**kwargs), smollm3_weights(state, cfg)
    elif cfg.pos.name == "learned":
        kwargs = hf_config_kwargs(cfg, run.tokenizer.vocab_size, run.tokenizer.eod_id, table)
        hf_cfg, weights = transformers.GPT2Config(**kwargs), gpt2_weights(state, cfg.model.n_layer)
    else:
        kwargs = hf_config_kwargs(cfg, run.tokenizer.vocab_size, run.tokenizer.eod_id, table)
        hf_cfg, weights = transformers.GPTNeoXConfig(**kwargs), neox_weights(state, cfg)
    hf_cfg.architectures = [target]
    tensors = {k: v.contiguous() for k, v in weights.items()}
    safetensors.torch.save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    set_default_mode(directory / "model.safetensors")  # save_file creates it 0o600
    hf_cfg.save_pretrained(str(directory))
    hf_tokenizer(run.tokenizer, table).save_pretrained(str(directory))
    info = {
        "source_run": str(run.path.resolve()),
        "step": run.meta.step,
        "scheme": cfg.pos.name,
        "weights_sha256": run.meta.files.get("model.safetensors"),
        "posenc_version": __version__,
        "transformers_version": transformers.__version__,
    }
    (directory / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return kwargs.get("rope_scaling"), table


def _publish(tmp: Path, out: Path) -> None:
    """fsync every file of `tmp`, then rename it to `out` (an empty `out` is replaced)."""
    for path in tmp.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
    if out.is_dir():
        out.rmdir()  # empty: checked before anything was written
    os.replace(tmp, out)
    fsync_dir(out.parent)


def _temp_prefix(out: Path, pid: int) -> str:
    """Name of an export's hidden working directory next to `out`: host and process id say whose it is."""
    return f".{out.name}.export-{socket.gethostname()}-{pid}-"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, as another user's process
        return True
    return True


def remove_stale_exports(out: Path) -> list[Path]:
    """Remove the working directories of earlier exports to `out` on this host whose process is gone (a kill);
    only directories with posenc's own naming (`_temp_prefix`) are touched. Returns what was removed."""
    pattern = re.compile(re.escape(f".{out.name}.export-{socket.gethostname()}-") + r"(\d+)-[^/]+")
    removed = []
    with contextlib.suppress(OSError):
        for path in out.parent.iterdir():
            m = pattern.fullmatch(path.name)
            if m and path.is_dir() and not path.is_symlink() and not _process_alive(int(m.group(1))):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def export_run(run_dir: Path | str, out_dir: Path | str, *, to: str = "hf", verify: bool = True) -> ExportResult:
    """Write run `run_dir` as a `transformers` model directory `out_dir` (which must not exist or be empty).

    Refusals (`UserError`, nothing written): `to` other than "hf", a non-exportable run (`NotExportable`), a
    non-empty `out_dir`, transformers not installed. Files are written to a hidden sibling directory, checked
    (`verify`: the reloaded model's logits against posenc's on random ids, as many as the learned table has rows,
    or twice the training length for RoPE, at most 256) and only then renamed to `out_dir`.
    """
    if to != "hf":
        raise ConfigError(f"--to {to} is not supported (available: hf)")
    out = Path(out_dir)
    _check_out_dir(out)
    run = load_run(run_dir)
    cfg = run.config
    if run.positions_dropped_at is not None:  # every architecture below encodes positions; this model has none
        raise NotExportable(
            f"not exportable: {run_dir} dropped its positions after step {run.positions_dropped_at} "
            "(train.drope_at); the transformers architectures posenc exports to all encode positions"
        )
    check_exportable(cfg)
    transformers = _require_transformers()
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_exports(out)
    tmp = make_temp_dir(out.parent, _temp_prefix(out, os.getpid()))  # the published directory keeps its mode
    try:
        rope_scaling, table = _write(run, tmp, transformers)
        length = min(table or 2 * cfg.train.seq_len, VERIFY_MAX_TOKENS)  # RoPE: beyond the training length too
        diff = None
        if verify:
            diff, scale = verify_export(run, tmp, length)
            if not diff <= VERIFY_RTOL * max(1.0, scale):  # NaN fails too
                raise UserError(
                    f"export check failed: transformers {transformers.__version__} gives logits that differ from "
                    f"posenc's by {diff:.3g}; nothing was written (--no-verify writes it anyway)"
                )
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    rope_type = None if cfg.pos.name != "rope" else (rope_scaling or {}).get("rope_type", "default")
    return ExportResult(
        run_dir=Path(run_dir),
        out_dir=out,
        scheme=cfg.pos.name,
        architecture=str(architecture(cfg)),
        step=run.meta.step,
        tokenizer=run.tokenizer.kind,
        rope_type=rope_type,
        rope_scaling=rope_scaling,
        max_length=table,
        files=sorted(p.name for p in out.iterdir()),
        verify_tokens=length if verify else None,
        max_abs_diff=diff,
    )
