"""A local `transformers` model directory as a posenc run (`eval-extrapolate`, `eval-passkey`, `compare`, `extend`).

A directory holding `config.json`, safetensors weights and a tokenizer is loaded through `AutoConfig`,
`AutoTokenizer` and `AutoModelForCausalLM` with `trust_remote_code=False`, and wrapped so that posenc's evaluation
code runs on it unchanged:

- `HFCausalLM` is a thin `nn.Module`: (B, T) ids -> (B, T, V) logits, with a `scheme` that names the positional
  scheme and, for learned positions, the table size (beyond it a length is "n/a", as for posenc's learned runs).
  Before each forward it estimates the memory the forward and posenc's loss will take and refuses, with one line,
  a batch that would not fit (`LengthBeyondMemory`), instead of letting the machine swap or the OOM killer strike.
- `HFTokenizer` gives the model's own tokenizer posenc's `Tokenizer` interface, including the UTF-8 bytes each
  token stands for, so bits per byte compare models with different tokenizers.
- The scheme comes from the architecture (learned: GPT-2, GPT-Neo, OPT, GPT-BigCode; ALiBi: BLOOM, MPT, Falcon with
  `alibi`; RoPE: every config with rope parameters: Llama, Mistral, Qwen2, Phi-3, GPT-NeoX, ...). The training
  length is `original_max_position_embeddings` of the global layers' rope parameters when the config has one (a
  RoPE-scaled model; Gemma 3's nested "full_attention" parameters); else, for a model whose every layer attends
  within a `sliding_window` shorter than its context size, that window (Mistral-7B-v0.1: window 4096,
  `max_position_embeddings` 32768), as microsoft/LongRoPE does (rope/__init__.py, lines 91-94, and
  evolution/search.py, lines 121-124, commit c9e56aa: `original_max_position_embeddings = config.sliding_window`
  when the config has one); else `max_position_embeddings` (or the architecture's name for it), also for a model
  that mixes windowed and global layers (Gemma 3, Qwen2 with `max_window_layers`): its global layers attend over
  that length. `train_length=` overrides it.
- Per-layer layouts (sliding windows, chunks, NoPE layers, rope parameters per layer type: `hf_layers`) are the
  model's own: posenc calls its forward, which builds its masks and rotary tables, with the attention kernel
  transformers picks (SDPA; eager for a model class without SDPA support, such as Gemma 2 with its logit
  softcapping); both apply the masks as tensors. meta records the kernel ("attention") and the layout ("layers"),
  with the attention details the model's modules have (learned sinks, QK-norms, v-norm, output gate:
  `hf_layers.attention_details`, read from the model built on the meta device).

Refused with one line (`CheckpointError`, exit 2) before any weight is read: a `config.json` that is not a small
JSON object (read through `posenc_cli.untrusted`), a config with `auto_map` or a `model_type` the installed
`transformers` does not know (both need remote code, which posenc never runs), a non-causal model (e.g.
`BertForMaskedLM`), weights only as pickles (`.bin`; posenc never unpickles), no tokenizer; a config describing far
more parameters than the weight files hold (`num_hidden_layers=100000` beside a 2-layer model's weights), or more
than memory holds (estimated from the config, `config_parameters`, and the safetensors headers, before anything is
built); a tokenizer that produces ids beyond the config's `vocab_size` (the embedding would be indexed out of
range); a `layer_types` entry the model builds no mask for (`hf_layers.MASK_TYPES`); an attention tensor of the
model config.json describes (built on the meta device) missing from the safetensors headers or of another shape
there, or sinks / QK-norm weights the model has no place for (`check_attention_weights`). After reading: weights
that are missing, corrupt or non-finite.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import stat
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from posenc_cli.bounds import MAX_TOKENS, Bound
from posenc_cli.data.tokenizer import Tokenizer
from posenc_cli.errors import CheckpointError, UserError
from posenc_cli.run.config_load import config_from_dict
from posenc_cli.run.hf_layers import MASK_TYPES, HFLayout, attention_details, hf_layout, train_length, unread_layer_type
from posenc_cli.run.load import LoadedRun
from posenc_cli.run.memory import available_memory as cpu_available_memory
from posenc_cli.run.meta import HF_CONFIG_FILE, RunMeta
from posenc_cli.untrusted import load_json, loads_json

__all__ = [
    "HFCausalLM",
    "HFScheme",
    "HFTokenizer",
    "LengthBeyondMemory",
    "available_memory",
    "cache_refusal",
    "config_parameters",
    "forward_bytes",
    "inspect_hf_dir",
    "load_hf_run",
    "stored_parameters",
    "stored_shapes",
    "train_length_override",
]

CONFIG_FILE = HF_CONFIG_FILE  # config.json (`run.meta.is_hf_dir`)
KIND = "transformers"
LEARNED = frozenset({"gpt2", "gpt_neo", "gpt_bigcode", "opt"})  # absolute position tables
ALIBI = frozenset({"bloom", "mpt"})  # (falcon: ALiBi when its config says `alibi`, else RoPE)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
SIDE_FILES = ("posenc_export.json", "posenc_hf_extend.json")  # posenc's own records of where a directory came from
MEMORY_HEADROOM = 0.9  # use at most this share of the available memory
CONFIG_MAX_BYTES = 4 * 2**20  # config.json files are a few kilobytes
MAX_SAFETENSORS_HEADER = 100_000_000  # the header limit safetensors itself enforces
# Loading in fp32: transformers builds the model on the meta device and fills it from the memory-mapped safetensors
# files, so about one fp32 copy of the weights is resident.
LOAD_BYTES_PER_PARAM = 4
# Gated MLPs (SwiGLU/GeGLU: gate, up and down projections) everywhere except these (two projections)
# Mixture-of-experts models whose every layer holds all its experts: {model_type: the config's expert count}
ALL_LAYERS_MOE = {"gpt_oss": "num_local_experts", "mixtral": "num_local_experts"}
UNGATED_MLP = frozenset({"gpt2", "gpt_neo", "gpt_bigcode", "opt", "gpt_neox", "bloom", "falcon", "mpt", "phi", "gptj"})
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # SentencePiece byte fallback: one byte


class LengthBeyondMemory(UserError):
    """A forward at this length and batch would need more memory than the device has available."""


# ----------------------------------------------------------------------------------------------------------------
# What a directory is.


@dataclass(frozen=True)
class HFInfo:
    """What `config.json` says, checked before anything is loaded."""

    path: Path
    model_type: str
    architecture: str
    scheme: str  # rope | learned | alibi
    train_length: int | None  # from the config; None when it names none (ALiBi models)
    max_length: int | None  # learned: the table size; None: no hard limit
    precision: str  # fp32 | bf16 | fp16: the dtype the weights were saved in
    vocab_size: int | None = None  # config.json's: the rows of the embedding
    layout: HFLayout | None = None  # which layers slide, chunk, skip RoPE (`hf_layers`)


def _read_config(path: Path) -> dict[str, Any]:
    file = path / CONFIG_FILE
    raw = load_json(file, what="transformers config", max_bytes=CONFIG_MAX_BYTES, max_depth=16, error=CheckpointError)
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file}: not a transformers config (not a JSON object)")
    return raw


def _scheme(model_type: str, raw: dict[str, Any]) -> str | None:
    if model_type in LEARNED:
        return "learned"
    if model_type in ALIBI or (model_type == "falcon" and raw.get("alibi")):
        return "alibi"
    rope_keys = ("rope_parameters", "rope_scaling", "rope_theta", "rotary_emb_base", "rotary_pct", "rotary_dim")
    if any(k in raw for k in rope_keys):
        return "rope"
    return None


def _config_length(raw: dict[str, Any], layout: HFLayout | None = None) -> int | None:
    """The training length config.json names (`hf_layers.train_length`: the global layers' original length, else
    a window every layer attends within, else the context size); `layout` defaults to the one transformers reads
    from `raw`."""
    if layout is None:
        text = _text_config(raw)
        layout = hf_layout(text) if text is not None else None
    return train_length(raw, layout)


def _text_config(raw: dict[str, Any], path: Path | None = None) -> Any:
    """config.json as the installed transformers' config class reads it (the text part of a multimodal config),
    so its per-layer layout is the one the model will use; None for a model_type transformers does not know."""
    return _text_part(_hf_config(raw, path))


def _text_part(config: Any) -> Any:
    """The language model's config of a (possibly multimodal) transformers config; None stays None."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _hf_config(raw: dict[str, Any], path: Path | None = None) -> Any:
    """config.json as the installed transformers' config class (None: a model_type transformers does not know)."""
    # deferred: keeps transformers off posenc --help start-up
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = str(raw.get("model_type") or "")
    if model_type not in CONFIG_MAPPING_NAMES:
        return None
    fields = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version")}
    try:
        with _quiet_transformers():
            config = AutoConfig.for_model(model_type, **fields)
    except Exception as e:  # a value the config class refuses (strict dataclass validation raises several types)
        where = f"{path}: " if path is not None else ""
        raise CheckpointError(f"{where}config.json is not a valid {model_type} config ({_first_line(e)})") from e
    return config


def _meta_model(config: Any, path: Path) -> nn.Module:
    """The model config.json describes, built on the meta device: its modules, names and shapes, no weights."""
    # deferred: keeps transformers off posenc --help start-up
    from transformers import AutoModelForCausalLM

    try:
        with _quiet_transformers(), torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception as e:  # a config its own class accepts but its model cannot be built from
        raise CheckpointError(
            f"{path}: transformers cannot build the model config.json describes ({_first_line(e)})"
        ) from e


# The attention tensors compared before loading, by their name from `layers.<i>.` on (a prefix such as
# `model.language_model.` may differ between a checkpoint and the class that reads it).
_ATTENTION_KEY = re.compile(r"(?:^|\.)(layers\.\d+\.(?:self_attn|attention)\..+)$")
_DETAIL_KEY = re.compile(r"\.(sinks|q_norm\.weight|k_norm\.weight)$")  # what a model without them would drop


def _by_attention_key(names: Iterable[tuple[str, tuple[int, ...]]]) -> dict[str, tuple[int, ...]]:
    """{`layers.<i>.self_attn....`: shape} of the attention tensors, leaving out names two tensors share (a
    multimodal model's vision and text layers)."""
    found: dict[str, list[tuple[int, ...]]] = {}
    for name, shape in names:
        m = _ATTENTION_KEY.search(name)
        if m is not None:
            found.setdefault(m.group(1), []).append(shape)
    return {k: v[0] for k, v in found.items() if len(v) == 1}


def check_attention_weights(path: Path, model: nn.Module, stored: dict[str, tuple[int, ...]]) -> None:
    """Before any weight is read: `CheckpointError` (one line) when an attention tensor of the model config.json
    describes (`_meta_model`) is missing from the weight files or has another shape there (sinks of the wrong
    size, a q_proj of a width the config cannot produce, QK-norm weights missing), or when the files hold sinks or
    QK-norm weights the model has no place for (transformers would drop them without a word)."""
    if getattr(model.config, "quantization_config", None) is not None:
        return  # packed tensors have other shapes; transformers' own loading checks them
    expected = _by_attention_key((n, tuple(p.shape)) for n, p in model.named_parameters())
    present = _by_attention_key(stored.items())
    if not present or not expected:
        return  # names this check cannot pair: transformers' own loading decides
    for key, shape in expected.items():
        if key not in present:
            raise CheckpointError(f"{path}: the weight files have no {key} (shape {list(shape)}), which the "
                                  "model config.json describes has")  # fmt: skip
        if present[key] != shape:
            raise CheckpointError(f"{path}: {key} has shape {list(present[key])} in the weight files, but the model "
                                  f"config.json describes needs {list(shape)}")  # fmt: skip
    extra = sorted(k for k in present if k not in expected and _DETAIL_KEY.search(k))
    if extra:
        raise CheckpointError(f"{path}: the weight files hold {extra[0]}, which the model config.json describes "
                              "has no place for (transformers would drop it)")  # fmt: skip


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _first_int(raw: dict[str, Any], *keys: str) -> int | None:
    return next((int(raw[k]) for k in keys if _positive_int(raw.get(k))), None)


def config_parameters(raw: dict[str, Any]) -> int | None:
    """A lower bound on the parameters a transformers config describes (None when it names no sizes).

    Per layer: attention q and o (2·d·H·head_dim) plus k and v (2·d·H_kv·head_dim), the MLP (3·d·ffn when gated,
    2·d·ffn for the GPT-2-style families in `UNGATED_MLP`; E experts of it in the `ALL_LAYERS_MOE` families, GPT-OSS
    and Mixtral); plus one embedding matrix (V·d; tied or not) and a learned position table. Norms, biases, sinks,
    routers, the experts of models that mix dense and MoE layers and untied heads are left out, so a real model is
    never below it.
    """
    d = _first_int(raw, "hidden_size", "n_embd", "d_model")
    layers = _first_int(raw, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    if d is None or layers is None:
        return None
    heads = _first_int(raw, "num_attention_heads", "n_head", "num_heads") or 1
    kv = 1 if raw.get("multi_query") is True else _first_int(raw, "num_key_value_heads", "n_head_kv", "num_kv_heads")
    head_dim = _first_int(raw, "head_dim") or max(d // heads, 1)
    ffn = _first_int(raw, "intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size") or 4 * d
    mlp = (2 if str(raw.get("model_type")) in UNGATED_MLP else 3) * d * ffn
    experts_key = ALL_LAYERS_MOE.get(str(raw.get("model_type")))
    mlp *= (_first_int(raw, experts_key) or 1) if experts_key else 1
    attention = 2 * d * heads * head_dim + 2 * d * (kv or heads) * head_dim
    vocab = _first_int(raw, "vocab_size", "padded_vocab_size") or 0
    learned = raw.get("model_type") in LEARNED
    table = (_first_int(raw, "max_position_embeddings", "n_positions") or 0) if learned else 0
    return layers * (attention + mlp) + vocab * d + table * d


def stored_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of every tensor in the directory's `*.safetensors` files, from their JSON headers only
    (bounded reads; a FIFO or device named like a weight file is refused without blocking)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        try:
            fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError as e:
            raise CheckpointError(_bad_weights(file, os.strerror(e.errno or 0))) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointError(_bad_weights(file, "not a regular file"))
            n = int.from_bytes(os.pread(fd, 8, 0), "little") if st.st_size >= 8 else -1
            if not 0 < n <= min(MAX_SAFETENSORS_HEADER, st.st_size - 8):
                raise CheckpointError(_bad_weights(file, f"header length {n} does not fit the file"))
            header = loads_json(os.pread(fd, n, 8), source=file, what="safetensors header", error=CheckpointError)
        finally:
            os.close(fd)
        if not isinstance(header, dict):
            raise CheckpointError(_bad_weights(file, "header is not a JSON object"))
        for name, entry in header.items():
            shape = entry.get("shape") if isinstance(entry, dict) else None
            if name == "__metadata__":
                continue
            if not isinstance(shape, list) or not all(isinstance(x, int) and x >= 0 for x in shape):
                raise CheckpointError(_bad_weights(file, f"tensor {name!r} has no valid shape"))
            shapes[name] = tuple(shape)
    return shapes


def stored_parameters(path: Path) -> int:
    """Elements of every tensor in the directory's `*.safetensors` files, from their headers (`stored_shapes`)."""
    return sum(math.prod(shape) for shape in stored_shapes(path).values())


def _bad_weights(file: Path, why: str) -> str:
    return f"{file.parent}: weights could not be loaded ({file.name}: {why})"


def check_size(path: Path, raw: dict[str, Any], available: int | None = None, stored: int | None = None) -> None:
    """Before anything is built: refuse (one line) a config describing many more parameters than the weight files
    hold (at least twice as many, plus a million: a real model is never below `config_parameters`), and a model
    that would not fit in memory once loaded in fp32 (`LOAD_BYTES_PER_PARAM`, at most `MEMORY_HEADROOM` of what
    `run.memory.available_memory` reports). `stored`: the files' element count when the caller read the headers
    already (None: read them here)."""
    described = config_parameters(raw)
    stored = stored_parameters(path) if stored is None else stored
    if described is not None and described > 2 * stored + 1_000_000:
        sizes = ", ".join(
            f"{k}={raw[k]}" for k in ("num_hidden_layers", "n_layer", "hidden_size", "n_embd", "vocab_size") if k in raw
        )
        raise CheckpointError(
            f"{path}: config.json ({sizes}) describes at least {described:.3g} parameters but the weight files hold "
            f"{stored:.3g}; the config does not belong to these weights"
        )
    n = max(described or 0, stored)
    free = cpu_available_memory() if available is None else available
    if free is not None and n * LOAD_BYTES_PER_PARAM > MEMORY_HEADROOM * free:
        raise CheckpointError(
            f"{path}: about {n:.3g} parameters need about {_gib(n * LOAD_BYTES_PER_PARAM)} in fp32 and "
            f"{_gib(free)} of memory is available"
        )


def _posenc_lengths(path: Path) -> dict[str, int]:
    """train_length / base_length recorded by posenc's export or extend in this directory (empty when none)."""
    for name in SIDE_FILES:
        if not (path / name).exists():
            continue
        with contextlib.suppress(UserError):
            info = load_json(path / name, what="posenc record", max_bytes=2**20, error=CheckpointError)
            if isinstance(info, dict):
                return {k: int(info[k]) for k in ("train_length", "base_length") if isinstance(info.get(k), int)}
    return {}


# The sizes posenc reads from config.json, each a whole number in range where it is set (null: not set); a window
# or chunk of 0 or below would attend to nothing or to everything without a word (issue #40).
HF_FIELD_BOUNDS: dict[str, Bound] = {
    "sliding_window": Bound(1, MAX_TOKENS, integer=True),
    "attention_chunk_size": Bound(1, MAX_TOKENS, integer=True),
    "max_position_embeddings": Bound(1, 1 << 30, integer=True),
    "n_positions": Bound(1, 1 << 30, integer=True),
    "original_max_position_embeddings": Bound(1, 1 << 30, integer=True),
    "hidden_size": Bound(1, 1 << 20, integer=True),
    "intermediate_size": Bound(1, 1 << 22, integer=True),
    "num_hidden_layers": Bound(1, 1 << 20, integer=True),
    "num_attention_heads": Bound(1, 1 << 20, integer=True),
    "num_key_value_heads": Bound(1, 1 << 20, integer=True),
    "head_dim": Bound(1, 1 << 16, integer=True),
    "vocab_size": Bound(1, 1 << 24, integer=True),
    "rope_theta": Bound(1e-6, 1e15),
}


def check_config_fields(path: Path, raw: dict[str, Any]) -> None:
    """`CheckpointError` naming the first field of `HF_FIELD_BOUNDS` (in config.json or its text_config) out of
    range, before transformers reads any of it."""
    for where, part in (("", raw), ("text_config.", raw.get("text_config"))):
        if not isinstance(part, dict):
            continue
        for name, bound in HF_FIELD_BOUNDS.items():
            value = part.get(name)
            problem = bound.problem(value) if value is not None else None
            if problem is not None:
                raise CheckpointError(f"{path}: config.json's {where}{name} {problem}")


def inspect_hf_dir(path: Path | str) -> HFInfo:
    """Check a transformers directory without loading it; one-line `CheckpointError` for each refusal."""
    p = Path(path)
    raw = _read_config(p)
    model_type = str(raw.get("model_type") or "")
    if "auto_map" in raw:
        raise CheckpointError(
            f"{p}: this model needs remote code (auto_map in config.json); "
            "posenc never runs it (trust_remote_code=False)"
        )
    check_config_fields(p, raw)  # before transformers is even imported
    # deferred: keeps transformers off posenc --help start-up
    from transformers import __version__ as tf_version
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        raise CheckpointError(
            f"{p}: model_type {model_type!r} is unknown to transformers {tf_version} (it would need remote code, "
            "which posenc never runs, or a newer transformers)"
        )
    causal = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    archs = [a for a in raw.get("architectures") or [] if isinstance(a, str)]
    causal_names = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    if causal is None or (archs and not any(a in causal_names for a in archs)):
        shown = ", ".join(archs) or model_type
        raise CheckpointError(f"{p}: not a causal language model ({shown}); posenc evaluates decoder-only causal LMs")
    scheme = _scheme(model_type, raw)
    if scheme is None:
        raise CheckpointError(
            f"{p}: model_type {model_type!r} is not a decoder-only LM with a positional scheme posenc recognises "
            "(RoPE, learned, ALiBi)"
        )
    files = [f.name for f in p.iterdir() if f.is_file()]
    if not any(f.endswith(".safetensors") for f in files):
        pickles = any(f.endswith((".bin", ".pt", ".pth", ".ckpt")) for f in files)
        why = "weights only as pickles (.bin); posenc loads safetensors only" if pickles else "no .safetensors weights"
        raise CheckpointError(f"{p}: {why}")
    if not any(name in files for name in TOKENIZER_FILES):
        raise CheckpointError(
            f"{p}: no tokenizer (tokenizer.json, tokenizer.model or vocab.json); save it with the model"
        )
    shapes = stored_shapes(p)  # the safetensors headers, read once for both checks
    check_size(p, raw, stored=sum(math.prod(shape) for shape in shapes.values()))
    config = _hf_config(raw, p)
    text = _text_part(config)
    layout = None
    if text is not None:
        unread = unread_layer_type(text)
        if unread is not None:
            raise CheckpointError(
                f"{p}: config.json's layer_types has {unread!r}, for which {text.model_type} builds no attention "
                f"mask (its types: {', '.join(sorted(MASK_TYPES[text.model_type]))})"
            )
        model = _meta_model(config, p)
        check_attention_weights(p, model, shapes)
        layout = replace(hf_layout(text), details=attention_details(model, text))
    length = _config_length(raw, layout)
    dtype = str(raw.get("dtype") or raw.get("torch_dtype") or "float32")
    return HFInfo(
        path=p,
        model_type=model_type,
        architecture=archs[0] if archs else causal,
        scheme=scheme,
        train_length=length,
        max_length=length if scheme == "learned" else None,
        precision={"bfloat16": "bf16", "float16": "fp16"}.get(dtype, "fp32"),
        vocab_size=_first_int(raw, "vocab_size", "padded_vocab_size"),
        layout=layout,
    )


# ----------------------------------------------------------------------------------------------------------------
# The tokenizer.


def token_byte_counts(vocab: dict[str, int], added: dict[int, Any], size: int) -> np.ndarray:
    """(size,) int64: UTF-8 bytes each id stands for; 0 for special tokens and ids the tokenizer does not use.

    Byte-level BPE (GPT-2, Llama 3, Qwen, Pythia, SmolLM): every character of a token is one byte (GPT-2's byte
    map). Otherwise (SentencePiece-style): `<0xNN>` is one byte, '▁' is a space, the rest is its UTF-8 length; a
    leading '▁' that the tokenizer adds to each document then counts one byte too many per document.
    """
    # deferred: keeps tokenizers off posenc --help start-up
    from tokenizers import pre_tokenizers

    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    added_ids = set(added)
    plain = {t: i for t, i in vocab.items() if i not in added_ids}
    byte_level = all(set(t) <= alphabet for t in plain)
    out = np.zeros(size, dtype=np.int64)
    for token, idx in plain.items():  # one pass over the vocabulary
        if byte_level:
            out[idx] = len(token)
        elif _BYTE_TOKEN.fullmatch(token):
            out[idx] = 1
        else:
            out[idx] = len(token.replace("\u2581", " ").encode("utf-8"))
    for idx, tok in added.items():
        if not getattr(tok, "special", True) and idx < size:
            out[idx] = len(str(tok.content).encode("utf-8"))
    return out


class HFTokenizer(Tokenizer):
    """posenc's tokenizer interface over a `transformers` fast tokenizer; documents end with its EOS token.

    No BOS is added (`add_special_tokens=False`), as for posenc's own tokenizers, and special-token strings inside
    the text are encoded as text, so only the pipeline places an end of document.
    """

    kind = "hf"

    def __init__(self, hf_tokenizer: Any, model_vocab: int, source: str) -> None:
        backend = getattr(hf_tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise CheckpointError(f"{source}: posenc needs a fast tokenizer (tokenizer.json)")
        eod = hf_tokenizer.eos_token_id if hf_tokenizer.eos_token_id is not None else hf_tokenizer.bos_token_id
        if eod is None:
            raise CheckpointError(f"{source}: the tokenizer has no end-of-text (eos) token to separate documents")
        self._hf = hf_tokenizer
        self._backend = backend
        self._backend.encode_special_tokens = True
        self.eod_id = int(eod)
        added = backend.get_added_tokens_decoder()
        plain = backend.get_vocab(with_added_tokens=False)
        # ids the pipeline can produce: the plain vocabulary, non-special added tokens and the end of document
        produced = [*plain.values(), *(i for i, t in added.items() if not getattr(t, "special", True)), self.eod_id]
        top = max(produced)
        if top >= int(model_vocab):
            raise CheckpointError(
                f"{source}: the tokenizer produces ids up to {top} but the model's vocab_size is {model_vocab}; "
                "ids from vocab_size on have no embedding (a tokenizer of another model, or vocab_size edited)"
            )
        self.vocab_size = max(int(model_vocab), len(hf_tokenizer))
        self.token_bytes = token_byte_counts(plain, added, self.vocab_size)
        self.token_bytes[self.eod_id] = 0
        digest = hashlib.sha256(backend.to_str().encode("utf-8") + f"|eod={self.eod_id}".encode())
        self.fingerprint = digest.hexdigest()[:16]

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._backend.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def encode_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.empty(0, dtype=self.dtype)
        encodings = self._backend.encode_batch_fast(list(texts), add_special_tokens=False)
        eod = np.array([self.eod_id], dtype=self.dtype)
        parts: list[np.ndarray] = []
        for enc in encodings:  # one step per document
            parts += [np.asarray(enc.ids, dtype=self.dtype), eod]
        return np.concatenate(parts)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64).ravel()
        return str(self._hf.decode(arr.tolist(), skip_special_tokens=False))

    def describe(self) -> str:
        return f"{type(self._hf).__name__} (vocab {self.vocab_size})"


# ----------------------------------------------------------------------------------------------------------------
# Memory: estimate a forward before running it.


def available_memory(device: torch.device) -> int | None:
    """Bytes free for a forward on `device`: CUDA's free memory; on CPU min(MemAvailable, cgroup limit - usage)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    return cpu_available_memory()


def forward_bytes(batch: int, length: int, *, vocab: int, hidden: int, ffn: int, heads: int, eager: bool) -> int:
    """Estimated peak bytes of one scored forward of (batch, length) ids, beyond the resident weights.

    fp32 logits (B, T, V) plus posenc's log-softmax of them (a second such tensor); per layer the transient
    activations (q, k, v, output and the MLP's hidden, ~(4·d + 3·ffn) floats per token); attention: SDPA's fused
    kernels keep O(T) per query block, eager attention materialises scores and probabilities (2·B·H·T² floats).
    """
    logits = 2 * batch * length * vocab * 4
    activations = batch * length * (4 * hidden + 3 * ffn) * 4
    attention = 2 * batch * heads * length * length * 4 if eager else batch * length * length  # bool mask
    return logits + activations + attention


@dataclass(frozen=True)
class HFScheme:
    """What posenc's evaluation asks of `model.scheme`: a name and, for learned positions, the table size."""

    name: str
    max_length: int | None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


class HFCausalLM(nn.Module):
    """(B, T) int64 ids -> (B, T, V) logits of a `transformers` causal LM, memory-checked first; `decode_step` reads
    one more chunk against the model's own KV cache (greedy decoding, `evaluation.passkey.greedy_decode`)."""

    def __init__(self, hf_model: nn.Module, scheme: HFScheme) -> None:
        super().__init__()
        self.hf = hf_model
        self.scheme = scheme
        cfg = hf_model.config
        self._dims = {
            "vocab": int(hf_model.get_output_embeddings().weight.shape[0]),
            "hidden": int(getattr(cfg, "hidden_size", 0) or 0),
            "ffn": int(getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 0)
            or 4 * int(getattr(cfg, "hidden_size", 0) or 0),
            "heads": int(getattr(cfg, "num_attention_heads", 1) or 1),
            "eager": getattr(cfg, "_attn_implementation", "sdpa") == "eager",
        }

    def check_memory(self, batch: int, length: int, device: torch.device) -> None:
        """Raise `LengthBeyondMemory` (one line) when a (batch, length) forward would not fit in memory."""
        need = forward_bytes(batch, length, **self._dims)
        free = available_memory(device)
        if free is None or need <= MEMORY_HEADROOM * free:
            return
        one = forward_bytes(1, length, **self._dims)
        hint = (
            f"; one window needs {_gib(one)}: lower --batch-tokens to {length}"
            if batch > 1 and one <= MEMORY_HEADROOM * free
            else "; evaluate shorter lengths"
        )
        raise LengthBeyondMemory(
            f"length {length} × batch {batch} needs about {_gib(need)} on {device.type}, "
            f"more than the {_gib(free)} available{hint}"
        )

    def forward(self, idx: Tensor, position_ids: Tensor | None = None) -> Tensor:
        """(B, T) ids -> (B, T, V) logits; `position_ids` (B, T): the ids the model's own RoPE or table reads."""
        self.check_memory(int(idx.shape[0]), int(idx.shape[1]), idx.device)
        ids: dict[str, Tensor] = {}  # BLOOM's forward takes no ids (ALiBi)
        if position_ids is not None:  # a mask of ones: without one transformers reads ids that skip as packed rows
            ids = {"position_ids": position_ids, "attention_mask": torch.ones_like(idx)}
        return self.hf(input_ids=idx, use_cache=False, **ids).logits  # (B, T, V)

    def uncached_reason(self) -> str | None:
        """Why greedy decoding cannot go through the model's own KV cache (None: it can; see `decode_step`)."""
        return cache_refusal(_rope_types(self.hf.config))

    def decode_step(self, idx: Tensor, past: Any = None, position_ids: Tensor | None = None) -> tuple[Tensor, Any]:
        """One forward of `idx` (B, T) against the model's own KV cache `past` (None: a new one, for the prompt)
        -> (last position's logits (B, V), the cache holding `idx` too); the memory check covers the prompt."""
        if past is None:
            self.check_memory(int(idx.shape[0]), int(idx.shape[1]), idx.device)
        ids = {} if position_ids is None else {"position_ids": position_ids}  # (a cache: never read as packed rows)
        out = self.hf(input_ids=idx, cache=past, use_cache=True, logits_to_keep=1, **ids)
        return out.logits[:, -1, :], out.cache  # (B, V)


# RoPE types whose frequencies depend on the length read so far (transformers' `dynamic_rope_update`): a full
# forward re-rotates every key at each new length, a cache keeps keys rotated at the length they were written, so
# decoding through the cache would not give the full forward's tokens.
LENGTH_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})


def _rope_types(config: Any) -> set[str]:
    """The `rope_type`s of a transformers config (flat or nested by layer type, Gemma 3); empty without RoPE."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if not isinstance(rope, dict):
        return set()
    sets = [v for v in rope.values() if isinstance(v, dict)] or [rope]
    return {str(r.get("rope_type") or r.get("type") or "default") for r in sets}


def cache_refusal(rope_types: Iterable[str]) -> str | None:
    """The reason a checkpoint with these rope types decodes by full forwards (`LENGTH_DEPENDENT_ROPE`), or None."""
    dependent = sorted(set(rope_types) & LENGTH_DEPENDENT_ROPE)
    if dependent:
        return f"rope_type {dependent[0]} changes the frequencies with the length read, which a KV cache cannot follow"
    return None


# ----------------------------------------------------------------------------------------------------------------
# Loading.

_TRAIN_LENGTH: ContextVar[int | None] = ContextVar("posenc_hf_train_length", default=None)


@contextlib.contextmanager
def train_length_override(length: int | None) -> Iterator[None]:
    """Within the block, transformers directories are loaded with this training length (None: from the config)."""
    token = _TRAIN_LENGTH.set(length)
    try:
        yield
    finally:
        _TRAIN_LENGTH.reset(token)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    # deferred: keeps transformers off posenc --help start-up
    from transformers.utils import logging as tf_logging

    verbosity = tf_logging.get_verbosity()
    tf_logging.set_verbosity_error()
    tf_logging.disable_progress_bar()
    try:
        yield
    finally:
        tf_logging.set_verbosity(verbosity)
        tf_logging.enable_progress_bar()


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _load_model(info: HFInfo) -> nn.Module:
    # deferred: keeps transformers off posenc --help start-up
    from transformers import AutoModelForCausalLM

    try:
        model, loading = AutoModelForCausalLM.from_pretrained(
            str(info.path),
            trust_remote_code=False,
            use_safetensors=True,
            dtype=torch.float32,
            output_loading_info=True,
        )
    except Exception as e:  # a corrupt header, truncated data, shape mismatch ...: transformers raises many types
        raise CheckpointError(f"{info.path}: weights could not be loaded ({_first_line(e)})") from e
    missing = sorted(loading.get("missing_keys") or []) + sorted(loading.get("mismatched_keys") or [])
    if missing:
        raise CheckpointError(f"{info.path}: weights incomplete or mismatched (e.g. {missing[0]})")
    for name, p in model.named_parameters():
        if p.is_floating_point() and not bool(torch.isfinite(p).all()):
            raise CheckpointError(f"{info.path}: weight '{name}' has non-finite values")
    return model


def _load_tokenizer(info: HFInfo, model_vocab: int) -> HFTokenizer:
    # deferred: keeps transformers off posenc --help start-up
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(info.path), trust_remote_code=False)
    except Exception as e:  # missing files, bad JSON, a tokenizer class that needs remote code ...
        raise CheckpointError(f"{info.path}: tokenizer could not be loaded ({_first_line(e)})") from e
    return HFTokenizer(tok, model_vocab, str(info.path))


def weights_identity(path: Path) -> str:
    """A fingerprint of config.json and the weight files (name, size, mtime): cheap, unlike hashing gigabytes, and
    it changes when either is replaced, so results cached in `eval/` are measured again."""
    digest = hashlib.sha256((path / CONFIG_FILE).read_bytes())
    for f in sorted(path.glob("*.safetensors")):
        st = f.stat()
        digest.update(f"|{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()


def run_config(info: HFInfo, train_length: int) -> Any:
    """A posenc `Config` naming the scheme and training length (what evaluation reads from a run's config)."""
    return config_from_dict({"pos": {"name": info.scheme}, "train": {"seq_len": train_length}})


def load_hf_run(
    path: Path | str, device: str | torch.device = "cpu", *, train_length: int | None = None
) -> Any:  # LoadedRun
    """Load a transformers directory as a `LoadedRun` (model wrapped by `HFCausalLM`, tokenizer by `HFTokenizer`).

    `train_length` (else `train_length_override`, else posenc's export/extend record, else the config) sets the
    run's training and base length. meta: kind "transformers", step 0, precision from the saved dtype.
    """
    info = inspect_hf_dir(path)
    recorded = _posenc_lengths(info.path)
    override = train_length if train_length is not None else _TRAIN_LENGTH.get()
    length = override or recorded.get("train_length") or info.train_length
    if length is None:
        raise CheckpointError(f"{info.path}: config.json names no context length; give --train-length")
    base = override or recorded.get("base_length") or length
    with _quiet_transformers():
        # a tokenizer beyond the embedding is refused before the weights are read
        tokenizer = _load_tokenizer(info, info.vocab_size) if info.vocab_size is not None else None
        model = _load_model(info)
        vocab = int(model.get_output_embeddings().weight.shape[0])
        if tokenizer is None or vocab != info.vocab_size:
            tokenizer = _load_tokenizer(info, vocab)
    wrapped = HFCausalLM(model, HFScheme(info.scheme, info.max_length)).to(device).eval()
    meta = {
        "kind": KIND,
        "step": 0,
        "files": {"model.safetensors": weights_identity(info.path)},  # what cached results are keyed by
        "model_type": info.model_type,
        "architecture": info.architecture,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_length": int(length),
        "base_length": int(base),
        "precision": info.precision,
        "attention": str(getattr(model.config, "_attn_implementation", None) or "default"),
    }
    if info.layout is not None:
        meta["layers"] = info.layout.describe()  # what the model's own masks and rotary tables do per layer
    return LoadedRun(
        path=info.path,
        model=wrapped,
        config=run_config(info, int(length)),
        meta=RunMeta.from_json(meta),
        tokenizer=tokenizer,
    )
