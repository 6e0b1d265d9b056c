"""Typed configuration: one dataclass per config group, validation, and (de)serialisation.

Hydra composes YAML into a plain dict (see `run.config_compose`); `run.config_load.config_from_dict` turns that dict
into these dataclasses (with `build_dataclass` below), rejecting unknown keys, wrong types and out-of-range values with
one line that names the key. The same function rebuilds the config saved in a run directory, so evaluation and extension
never need Hydra. Model code only ever sees these dataclasses. The positional schemes and data sources subclass
`PosConfig` and `DataConfig`, so this module sits below their registries and never imports them.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from posenc_cli.bounds import MAX_STEPS, MAX_THREADS, MAX_TOKENS, Bound
from posenc_cli.errors import ConfigError
from posenc_cli.rope_scaling import NONE, ScalingSettings, method_names, param_fields, params_class
from posenc_cli.untrusted import load_yaml

MAX_SEED = 2**63 - 1  # torch.manual_seed takes [-2**63, 2**64) and seed + 1 seeds the sampler; numpy: seed mod 2**32

# Dotted keys (or key prefixes) that are not part of what a run is. RUNTIME_KEYS change how fast a run goes or what it
# logs, never its numbers (beyond float rounding): a sweep job planned with other values is reused (`sweep.identity`).
# Runs whose configs agree but for these, the seeds and the bookkeeping (when validation runs and checkpoints are
# written, where caches live, what evaluation was configured at training time) are the seeds of one experiment
# (`analysis.rows`: NOT_IDENTITY_KEYS). A sweep job's identity keeps the bookkeeping: it names the job's files.
RUNTIME_KEYS = ("train.device", "train.threads", "train.log_every", "train.logger", "train.compile")
SEED_KEYS = ("train.seed", "extend.longrope_search_seed")
BOOKKEEPING_KEYS = ("train.eval_every", "train.eval_batches", "train.save_every", "data.cache_dir", "eval.")
NOT_IDENTITY_KEYS = (*RUNTIME_KEYS, *SEED_KEYS, *BOOKKEEPING_KEYS)


TemperatureForm = Literal["cell", "query"]  # DroPE's β: one per evaluation cell, or per query (`temperatures.drope`)
TEMPERATURE_FORMS: tuple[TemperatureForm, ...] = ("cell", "query")


@dataclass(kw_only=True)
class ModelConfig:
    """Decoder-only transformer sizes (`model=tiny|small|base`)."""

    d_model: int = 128
    n_layer: int = 4
    n_head: int = 4
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    mlp_ratio: int = 4
    bias: bool = True
    dropout: float = 0.0
    init_std: float = 0.02
    embedding: Literal["gpt2", "fairseq"] = "gpt2"  # the embedding recipe, the same for every scheme
    # The attention temperature every layer applies (an entry of `posenc_cli.temperatures`): `logn` multiplies
    # query n's logits by max(1, log n / log L) (Qwen's use_logn_attn), `ssmax` by s_h·log n with s_h learned per
    # head (SSMax), `drope` by DroPE's β = 1 + c·ln(max(1, s)) with c = `temperature_c` (s: the evaluation cell's
    # length over L, or the query's n / L with temperature_form=query), `head-scale` by a learned λ_h per head (NoPE
    # HeadScale; fitted by `posenc calibrate`).
    attn_scale: Literal["none", "logn", "ssmax", "drope", "head-scale"] = "none"
    logn_length: int = 0  # L of the temperature (SSMax: s_h starts at 1/log L); 0: the training length, written
    temperature_c: float = 0.0  # DroPE's c (model.attn_scale=drope), any sign; fitted by `posenc calibrate`
    # DroPE's s: `cell` one β per evaluation cell (the reference's), `query` per query (a saved drope config without
    # the key: `legacy_model_defaults`)
    temperature_form: TemperatureForm = "cell"
    # Model options (one file each in `posenc_cli/options`, docs/commands/model-options.md); every default is off,
    # the model of posenc before they existed. attn_sinks: one learned logit per head in the softmax's normaliser
    # (GPT-OSS); attn_gate: a sigmoid gate on the attention output before the output projection, one per channel or
    # per head (Qiu et al. 2025); qk_norm: q and k normalised per head, `rms` with a weight before the rotation
    # (Qwen3), `l2` weightless after it (Llama 4), on every layer or (qk_norm_layers=rotary) only where the layer's
    # scheme rotates; canon: Canon layers at the placements named, any of A B C D (Allen-Zhu 2025), "" none.
    attn_sinks: bool = False
    attn_gate: Literal["none", "elementwise", "headwise"] = "none"
    qk_norm: Literal["none", "rms", "l2"] = "none"
    qk_norm_layers: Literal["all", "rotary"] = "all"
    canon: str = ""

    def validate(self) -> None:
        positive(self, "model", "d_model", "n_layer", "n_head", "mlp_ratio")
        canon = str(self.canon)
        if any(c not in "ABCD" for c in canon) or len(set(canon)) != len(canon):
            raise ConfigError(f"model.canon={canon!r}: any of the placements A, B, C, D, each once (e.g. AC; '' none)")
        if self.qk_norm_layers != "all" and self.qk_norm == "none":
            raise ConfigError(f"model.qk_norm_layers={self.qk_norm_layers} needs model.qk_norm=rms|l2")
        non_negative(self, "model", "logn_length")
        if self.attn_scale != "none" and self.logn_length == 1:
            raise ConfigError("model.logn_length must be 0 (the training length) or >= 2")
        if self.temperature_c and self.attn_scale != "drope":
            raise ConfigError(f"model.temperature_c (DroPE's c) needs model.attn_scale=drope, not {self.attn_scale}")
        if self.d_model % self.n_head:
            raise ConfigError(f"model.n_head={self.n_head} does not divide model.d_model={self.d_model}")
        if (self.d_model // self.n_head) % 2:
            raise ConfigError(f"head dim d_model/n_head={self.d_model // self.n_head} must be even")
        _probability(self, "model", "dropout")
        if self.init_std <= 0:
            raise ConfigError("model.init_std must be > 0")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    # The embedding recipe. gpt2: token (and learned position) tables N(0, init_std²), used as they are; the
    # sinusoid is added × init_std (see positional/sinusoidal.py). fairseq (`transformer_lm`, the ALiBi paper's
    # baselines): tables N(0, 1/D), token embeddings × √D (unit scale), the sinusoid added unscaled.
    @property
    def embed_scale(self) -> float:
        """Factor on the token embeddings before the scheme's embedding hook."""
        return float(self.d_model) ** 0.5 if self.embedding == "fairseq" else 1.0

    @property
    def embed_init_std(self) -> float:
        """Initial std of the token embedding table and of learned position tables."""
        return float(self.d_model) ** -0.5 if self.embedding == "fairseq" else self.init_std

    @property
    def sinusoid_scale(self) -> float:
        """Factor on a fixed sinusoid added to the embeddings (unless the scheme sets its own)."""
        return 1.0 if self.embedding == "fairseq" else self.init_std


def legacy_model_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """A saved config's `model` mapping with the keys it lacks set to what the posenc that wrote it did: a DroPE
    temperature saved before `temperature_form` existed was applied per query."""
    if raw.get("attn_scale") == "drope" and "temperature_form" not in raw:
        return {**raw, "temperature_form": "query"}
    return raw


def legacy_train_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """A saved config's `train` mapping with the keys it lacks set to what the posenc that wrote it did: randomized
    positions saved before `random_positions_draw` existed were drawn once per sequence for every layer."""
    if "random_positions_draw" not in raw:
        return {**raw, "random_positions_draw": "sequence"}
    return raw


@dataclass(kw_only=True)
class PosConfig:
    """Base of every scheme's options; `name` selects the scheme in the registry."""

    name: str = "nope"

    def validate(self) -> None:
        """Range checks of a scheme's own options (subclasses extend)."""

    def resolve(self, model: ModelConfig, train_length: int) -> None:
        """Replace options left unset (None) by their defaults for this model, so a run's config records them."""

    def legacy_defaults(self, model: ModelConfig) -> None:
        """Fill options a saved config left unset with the defaults of the posenc that wrote it (before `resolve`)."""


@dataclass(kw_only=True)
class DataConfig:
    """Options every data source has; `source` selects the source in `posenc_cli.data.sources` (`data=stdlib|text|hf|
    passkey`), whose own config class (a subclass: hub fields, `passkey_*`, ...) adds its options."""

    source: str = "stdlib"
    val_fraction: float = 0.02
    cache_dir: str | None = None

    def validate(self) -> None:
        """Range checks (subclasses extend)."""
        _probability(self, "data", "val_fraction")


@dataclass(kw_only=True)
class TokenizerConfig:
    """`byte`, `bpe` (trained on the corpus, `vocab_size` ids) or `hf`: a pretrained `tokenizers`/`transformers`
    folder `path` holding tokenizer.json. `sha256` (hf) is that file's hash, filled in by `validate` when empty (and
    checked against the file when a run starts), so a run's config and a sweep cell's key name the tokenizer's
    content, not only its path."""

    kind: Literal["byte", "bpe", "hf"] = "byte"
    vocab_size: int = 1024
    path: str | None = None
    sha256: str | None = None

    def validate(self) -> None:
        positive(self, "tokenizer", "vocab_size")
        if self.kind == "bpe" and self.vocab_size < 260:
            raise ConfigError("tokenizer.vocab_size must be >= 260 for bpe (256 bytes + specials)")
        if self.kind != "hf":
            return
        if not self.path:
            raise ConfigError("tokenizer=hf needs tokenizer.path=DIR (a folder holding tokenizer.json)")
        if self.sha256 is not None:  # a run's saved config keeps the hash; its run directory keeps the file
            return
        file = Path(self.path).expanduser() / "tokenizer.json"
        if not file.is_file():
            raise ConfigError(f"tokenizer.path={self.path}: no tokenizer.json in it")
        self.sha256 = hashlib.sha256(file.read_bytes()).hexdigest()


@dataclass(kw_only=True)
class TrainConfig:
    seq_len: int = 128
    batch_size: int = 16
    grad_accum: int = 1
    steps: int = 400
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 40
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    precision: Literal["fp32", "bf16", "auto"] = "auto"
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    threads: int = 0
    seed: int = 0
    log_every: int = 25
    eval_every: int = 100
    eval_batches: int = 8
    save_every: int = 200
    logger: Literal["none", "tensorboard", "wandb", "mlflow"] = "none"
    # Training-time position ids (posenc_cli/positional/ids.py). 0 = off. eval-extrapolate feeds a random_positions
    # run sorted draws from [0, M) too, as the reference does at test time (posenc_cli/evaluation/positions.py).
    random_positions: int = 0  # M: each sequence's ids a sorted random subset of [0, M) (Ruoss et al. 2023)
    # one subset per `layer` of each sequence (the reference's noisy RoPE/ALiBi draw in every layer), or one per
    # `sequence` for every layer (a saved config without the key: `legacy_train_defaults`)
    random_positions_draw: Literal["layer", "sequence"] = "layer"
    pose_length: int = 0  # PoSE: ids of each seq_len window skip-wise spanning [0, pose_length) (Zhu et al. 2023)
    pose_chunks: int = 2  # PoSE: chunks per window (2 in the paper)
    # Where training windows start: "uniform" over the token stream, or "document": at an end-of-document token, so
    # a window opens with one whole document at positions 1.. as an evaluation prompt does (the NoPE paper's
    # reference trains one example per sequence from position 0: McGill-NLP/length-generalization 40f8a44,
    # configs/data/seq2seq.jsonnet, decoder_only_group_samples: false). Needs documents shorter than seq_len.
    window_start: Literal["uniform", "document"] = "uniform"
    # What the loss trains on (posenc_cli/data/rows.py): "all" tokens, or the "answer": the tokens a data source
    # marks as scored (a prompt/answer example's answer and its end-of-document token; plain text: every token), as
    # the NoPE paper's reference does (McGill-NLP/length-generalization 40f8a44, decoder_only_mask_inputs: true).
    loss_on: Literal["all", "answer"] = "all"
    # How examples fill the rows of a batch: "stream" (windows of the concatenated token stream, window_start as
    # above), "none" (one example per row from position 0 after an end-of-document token, right-padded: the
    # reference's decoder_only_group_samples: false) or "document" (whole examples packed into a row, positions
    # restarting at 0 and attention kept within each example by a block-diagonal mask).
    packing: Literal["stream", "none", "document"] = "stream"
    # torch.compile of the model's training steps (posenc_cli/run/compile.py): false (eager), true (mode "default"),
    # or one of torch.compile's modes; "reduce-overhead" adds CUDA graphs, for small models whose GPU steps are
    # launch-bound. Validation and evaluation stay eager. Changes speed and float rounding, not what is trained.
    compile: bool | str = False
    # DroPE (Gelberg et al. 2025, arXiv 2512.12167; SakanaAI/DroPE): train with the configured scheme until step k,
    # then drop its positional encoding (a layout's windows stay, run/drope.py) and keep training (the paper's
    # "recalibration"). 0 = off.
    drope_at: int = 0
    compile_modes: ClassVar[tuple[str, ...]] = (
        "default",
        "reduce-overhead",
        "max-autotune",
        "max-autotune-no-cudagraphs",
    )

    def validate(self) -> None:
        if not isinstance(self.compile, bool) and self.compile not in self.compile_modes:
            raise ConfigError(
                f"train.compile={self.compile!r} is not one of false, true, {', '.join(self.compile_modes)}"
            )
        positive(self, "train", "seq_len", "batch_size", "grad_accum", "log_every", "eval_every", "eval_batches")
        positive(self, "train", "pose_chunks")
        non_negative(self, "train", "random_positions", "pose_length", "drope_at")
        for name in ("random_positions", "pose_length"):
            value = getattr(self, name)
            if 0 < value < self.seq_len:
                raise ConfigError(f"train.{name}={value} must be 0 (off) or >= train.seq_len={self.seq_len}")
        if self.random_positions and self.pose_length:
            raise ConfigError("train.random_positions and train.pose_length exclude each other; set one to 0")
        if self.packing != "stream":
            for name, off in (("random_positions", 0), ("pose_length", 0), ("window_start", "uniform")):
                if getattr(self, name) != off:
                    raise ConfigError(
                        f"train.packing={self.packing} sets each example's positions itself; train.{name} needs "
                        f"train.packing=stream (or train.{name}={off})"
                    )
        if self.pose_length and self.pose_chunks > self.seq_len:
            raise ConfigError(f"train.pose_chunks={self.pose_chunks} must be <= train.seq_len={self.seq_len}")
        positive(self, "train", "save_every")
        non_negative(self, "train", "steps", "warmup_steps", "threads", "weight_decay", "grad_clip")
        _check_finite(self, "train")
        if self.lr <= 0:
            raise ConfigError("train.lr must be > 0")
        _probability(self, "train", "min_lr_ratio", "beta1", "beta2")
        for name in ("beta1", "beta2"):  # Adam needs beta < 1: its bias correction divides by 1 - beta^t
            if getattr(self, name) >= 1:
                raise ConfigError(f"train.{name} must be < 1, got {getattr(self, name)}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"train.seed must be in [0, 2**63-1] (torch's seed range), got {self.seed}")


WINDOW_STRIDE_PROTOCOLS = ("sliding", "streaming")  # the eval protocols that take a stride


def legacy_eval_options(raw: dict[str, Any]) -> dict[str, Any]:
    """A saved config's `eval` mapping without a stride its protocol never used: posenc accepted `eval.stride` with
    any protocol before `EvalConfig.validate` refused it (it changed nothing: only sliding and streaming read it)."""
    if raw.get("stride") is not None and raw.get("protocol", "nonoverlap") not in WINDOW_STRIDE_PROTOCOLS:
        return {**raw, "stride": None}
    return raw


@dataclass(kw_only=True)
class EvalConfig:
    """Defaults of `posenc eval-extrapolate` (flags mirror these fields)."""

    lengths: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0, 4.0, 8.0, 16.0])
    abs_lengths: list[int] | None = None
    protocol: Literal["nonoverlap", "sliding", "fixed-target", "streaming"] = "nonoverlap"
    stride: int | None = None  # sliding: tokens scored per window; streaming: the block size (None: 1)
    target: int | None = None  # fixed-target: tokens scored per window (None: the base length)
    window: int | None = None  # streaming: recent tokens kept (None: base length - sinks - block + 1)
    sinks: int = 4  # streaming: first tokens of the stream kept (StreamingLLM's 4; 0 = plain sliding window)
    tokens: int = 16384
    batch_tokens: int = 16384
    dtype: Literal["auto", "fp32", "bf16"] = "auto"
    force: bool = False
    longppl: bool = True  # also LongPPL (evaluation.longppl) when an evaluator is named
    # The run that chooses LongPPL's key tokens for every evaluated run (PKU-ML/LongPPL's --evaluator-model); a
    # relative path is also looked up above each evaluated run (a sweep names a job: train/pos=alibi). None: none.
    longppl_evaluator: str | None = None

    def validate(self) -> None:
        _check_finite(self, "eval")
        positive(self, "eval", "tokens", "batch_tokens")
        if any(not x > 0 for x in self.lengths):
            raise ConfigError("eval.lengths must all be > 0")
        if self.abs_lengths is not None and any(x < 2 for x in self.abs_lengths):
            raise ConfigError("eval.abs_lengths must all be >= 2")
        if self.stride is not None and self.stride < 1:
            raise ConfigError("eval.stride must be >= 1")
        if self.target is not None and self.target < 1:
            raise ConfigError("eval.target must be >= 1")
        if self.window is not None and self.window < 1:
            raise ConfigError("eval.window must be >= 1")
        if self.sinks < 0:
            raise ConfigError("eval.sinks must be >= 0")
        if self.stride is not None and self.protocol not in WINDOW_STRIDE_PROTOCOLS:
            raise ConfigError(
                f"eval.stride (--stride) needs eval.protocol (--protocol) sliding or streaming, not {self.protocol}"
            )
        if self.longppl_evaluator is not None and self.protocol == "streaming":
            raise ConfigError("eval.longppl_evaluator: LongPPL is measured on window protocols, not streaming")


# Inference-time position remapping of a RoPE run (`positional.remap` holds the maths, `extension.remap` makes the
# child): its settings live here, with no torch, so `extend` plans a remapping and refuses bad ones before loading it.
REMAP_METHODS: tuple[str, ...] = ("self-extend", "rerope")


@dataclass(kw_only=True)
class RemapConfig:
    """`pos.remap`: method `none` (plain RoPE, the default), `self-extend` (window, group) or `rerope` (window,
    leaky: 0 for ReRoPE, k > 1 for Leaky ReRoPE)."""

    method: str = "none"
    window: int = 0
    group: int = 0
    leaky: float = 0.0

    def validate(self) -> None:
        if self.method == "none":
            return
        if self.method not in REMAP_METHODS:
            raise ConfigError(f"unknown pos.remap.method '{self.method}' (available: none, {', '.join(REMAP_METHODS)})")
        if self.window < 1:
            raise ConfigError(f"{self.method} needs a window >= 1 (pos.remap.window), got {self.window}")
        if self.method == "self-extend" and self.group < 1:
            raise ConfigError(f"self-extend needs a group size >= 1 (pos.remap.group), got {self.group}")
        if self.method == "rerope" and self.leaky != 0 and not self.leaky > 1:
            raise ConfigError(f"rerope's leaky k must be > 1 (0: not leaky), got {self.leaky}")
        if self.method == "self-extend" and self.leaky != 0:
            raise ConfigError("pos.remap.leaky belongs to rerope, not self-extend")
        if self.method == "rerope" and self.group != 0:
            raise ConfigError("pos.remap.group belongs to self-extend, not rerope")

    @property
    def active(self) -> bool:
        return self.method != "none"

    def describe(self) -> str:
        """'self-extend W=64 G=4', 'rerope W=64', 'rerope W=64 k=16' or 'none'."""
        if self.method == "self-extend":
            return f"self-extend W={self.window} G={self.group}"
        if self.method == "rerope":
            return f"rerope W={self.window}" + (f" k={self.leaky:g}" if self.leaky else "")
        return "none"


@dataclass(kw_only=True)
class ExtendConfig(ScalingSettings):
    """Defaults of `posenc extend` (flags mirror these fields): the scaling settings (`method`, `factor`,
    `original_length` and the method's own `params`, as `pos.scaling` holds them: `rope_scaling.ScalingSettings`),
    then the optional fine-tune.

    Overrides: `extend.method=llama3 extend.factor=8` as always; a method's parameter is nested under `params` and,
    as configs/extend/default.yaml lists none, added with Hydra's `+`: `+extend.params.beta_fast=16`. The flat key
    of earlier posenc versions (`extend.beta_fast=16`) is refused in one line naming the new key
    (`unknown_key_message`); a run's config.yaml saved in the flat layout still loads (`build_dataclass`)."""

    allow_none: ClassVar[bool] = False
    method: str = "yarn"
    factor: float = 4.0
    finetune_steps: int = 0
    finetune_seq_len: int | None = None
    finetune_lr: float = 3e-4
    finetune_warmup: int = 5
    pose: bool = False  # PoSE: fine-tune at the original length L with skip-wise ids spanning the fine-tune length
    pose_chunks: int = 2
    logn: bool = False  # log-n attention scaling (model.attn_scale=logn, L = the original length) on top
    # Instead of a scaling, a position remapping (`extend --method self-extend|rerope`; pos.remap of the child): what
    # a sweep's extend stage sets to compare the training-free remappings with the scalings.
    remap: str = "none"
    remap_window: int = 0
    remap_group: int = 0
    remap_leaky: float = 0.0
    # Log-n query scaling of a remapped child: None as the method's reference (on for ReRoPE, bojone/rerope
    # rerope_patch.py:56; off for Self-Extend, LongLM's scale_base default), true/false to choose.
    remap_logn: bool | None = None
    # LongRoPE in a sweep: search the long factors on the parent first (`extend --search`), with this many
    # candidates (0: off, the factors are given) and this seed.
    longrope_search: int = 0
    longrope_search_seed: int = 0
    # A per-layer layout: which RoPE layers to change (`extension.rope_layers`): global (full-attention ones, Gemma
    # 3's rule) or all. A plain RoPE run is changed whole under either.
    layers: Literal["global", "all"] = "global"

    def validate(self) -> None:
        _check_finite(self, "extend")
        if self.remap != "none":
            if self.remap not in REMAP_METHODS:
                raise ConfigError(f"unknown extend.remap '{self.remap}' (available: none, {', '.join(REMAP_METHODS)})")
            if self.finetune_steps or self.pose or self.logn:
                raise ConfigError(
                    f"extend.remap={self.remap} takes no fine-tune, PoSE or extend.logn (its log-n: extend.remap_logn)"
                )
            return  # the scaling fields are not used; remap_run validates the remapping itself
        if self.remap_logn is not None:
            raise ConfigError(
                "extend.remap_logn belongs to a remapping (extend.remap); a scaling's log-n is extend.logn"
            )
        if self.factor <= 1:
            raise ConfigError(f"extend.factor must be > 1, got {self.factor}")
        non_negative(self, "extend", "finetune_steps", "finetune_warmup", "longrope_search", "longrope_search_seed")
        if self.longrope_search and self.method != "longrope":
            raise ConfigError(
                f"extend.longrope_search finds LongRoPE factors; it needs extend.method=longrope, not {self.method}"
            )
        positive(self, "extend", "pose_chunks")
        if self.pose and self.finetune_steps == 0:
            raise ConfigError("extend.pose (--pose) needs a fine-tune: set --finetune-steps N")
        if self.original_length is not None and self.original_length < 2:
            raise ConfigError("extend.original_length must be >= 2")
        _check_finite(self.params, "extend.params")
        for f in dataclasses.fields(self.params):
            value = getattr(self.params, f.name)
            if f.metadata.get("positive") and value is not None and value <= 0:
                raise ConfigError(f"extend.params.{f.name} must be > 0, got {value}")


@dataclass(kw_only=True)
class Config:
    """The root config of a run; `config.yaml` in every run directory is this, resolved."""

    model: ModelConfig = field(default_factory=ModelConfig)
    pos: PosConfig = field(default_factory=PosConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    extend: ExtendConfig = field(default_factory=ExtendConfig)

    def __post_init__(self) -> None:
        self.pos.resolve(self.model, self.train.seq_len)  # defaults that depend on the model, written explicitly
        if self.model.attn_scale != "none" and not self.model.logn_length:
            self.model.logn_length = self.train.seq_len

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            group = getattr(self, f.name)
            _check_finite(group, f.name)  # every float of every group, the scheme's own options included
            group.validate()
            _check_magnitude(group, f.name)  # every number, then the sizes: before anything is built from them
            for name, bound in KEY_BOUNDS.items():
                key_group, _, key = name.partition(".")
                if key_group == f.name and getattr(group, key, None) is not None:
                    bound.check(getattr(group, key), name)


_SIZE = Bound(0, MAX_TOKENS, integer=True)
# Upper ends of the config keys that size the work (each group's validate() holds the rest of their range); every
# other number of every group is held to be finite and at most MAX_MAGNITUDE (`_check_finite`).
KEY_BOUNDS: dict[str, Bound] = {
    "model.d_model": Bound(1, 1 << 20, integer=True),
    "model.n_layer": Bound(1, 1 << 16, integer=True),
    "model.n_head": Bound(1, 1 << 16, integer=True),
    "model.logn_length": _SIZE,
    "tokenizer.vocab_size": Bound(1, 1 << 24, integer=True),
    "train.seq_len": _SIZE,
    "train.steps": Bound(0, MAX_STEPS, integer=True),
    "train.warmup_steps": Bound(0, MAX_STEPS, integer=True),
    "train.threads": Bound(0, MAX_THREADS, integer=True),
    "train.random_positions": _SIZE,
    "train.pose_length": _SIZE,
    "eval.tokens": _SIZE,
    "eval.batch_tokens": _SIZE,
    "eval.stride": _SIZE,
    "eval.target": _SIZE,
    "extend.finetune_steps": Bound(0, MAX_STEPS, integer=True),
    "extend.finetune_seq_len": _SIZE,
}
MAX_MAGNITUDE = 1e15  # no setting of posenc is larger (RoPE bases stay below 1e9, token budgets below 2**22)


# ----------------------------------------------------------------------------------------------------------------
# Building dataclasses from plain dicts, with one-line errors naming the key.


def build_dataclass(cls: type, raw: Any, prefix: str) -> Any:
    """Build dataclass `cls` from `raw`, checking keys and types recursively (a RoPE scaling: `_build_scaling`)."""
    if dataclasses.is_dataclass(raw) and isinstance(raw, cls):
        return raw
    if issubclass(cls, ScalingSettings):
        return _build_scaling(cls, raw, prefix)
    return _build_fields(cls, raw, prefix)


def _build_fields(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        dotted = _join(prefix, unknown[0])
        raise ConfigError(_unknown(dotted, dotted, sorted(fields), "valid keys"))
    kwargs = {name: _coerce(hints[name], value, _join(prefix, name)) for name, value in raw.items()}
    return cls(**kwargs)


def _build_scaling(cls: type[ScalingSettings], raw: Any, prefix: str) -> ScalingSettings:
    """A scaling (`pos.scaling`, `extend`) from `raw`: its own keys, then `params` with the chosen method's params
    class (unknown keys named as `<prefix>.params.<key>`). The flat layout runs were saved in before (every method's
    parameters beside `method`) is read as the method's own ones (`nest_scaling_params`)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {raw!r}")
    raw = nest_scaling_params(cls, raw, prefix)
    params = raw.pop("params", None)
    settings = _build_fields(cls, raw, prefix)
    allowed = (NONE, *method_names()) if cls.allow_none else method_names()
    if settings.method not in allowed:
        raise ConfigError(f"{_join(prefix, 'method')}={settings.method!r} is not one of {', '.join(allowed)}")
    params_cls = params_class(settings.method)
    assert params_cls is not None
    built = _build_fields(params_cls, {} if params is None else params, _join(prefix, "params"))
    return dataclasses.replace(settings, params=built)


def nest_scaling_params(cls: type[ScalingSettings], raw: dict[str, Any], prefix: str) -> dict[str, Any]:
    """`raw` in today's layout: a mapping in the flat layout of earlier posenc versions (`{method, factor,
    original_length, beta_fast, ..., long_factor}`: every method's parameters, no `params`) becomes `{method,
    factor, original_length, params: {the method's own}}` (the other methods' values were ignored then and are
    dropped). A flat parameter key beside `params` (an override typed the old way) is a one-line ConfigError naming
    its new key. Anything else is returned as it is."""
    own = {f.name for f in dataclasses.fields(cls)}
    flat = [k for k in raw if k in param_fields() and k not in own]
    if not flat:
        return dict(raw)
    if "params" in raw:
        raise ConfigError(_moved(_join(prefix, flat[0])))
    method = raw.get("method", next(f.default for f in dataclasses.fields(cls) if f.name == "method"))
    params_cls = params_class(method) if isinstance(method, str) else None
    keep = {f.name for f in dataclasses.fields(params_cls)} if params_cls is not None else set()
    out = {k: v for k, v in raw.items() if k not in flat}
    out["params"] = {k: raw[k] for k in flat if k in keep}
    return out


def nest_flat_scaling_keys(flat: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys (`flatten`) with a scaling in the flat layout of earlier versions (`extend.beta_fast`,
    `pos.scaling.long_factor`, ...) as today's layout gives them: the chosen method's parameters under
    `<group>.params.`, the other methods' dropped (they were ignored); keys already nested, and all others, kept.
    For records of configs written before the nesting (a sweep's planned identities), compared with today's."""
    out = dict(flat)
    names = param_fields()
    for group in _SCALING_GROUPS:
        old = [k for k in flat if k.startswith(f"{group}.") and k[len(group) + 1 :] in names]
        if not old:
            continue
        method = flat.get(f"{group}.method")
        params_cls = params_class(method) if isinstance(method, str) else None
        keep = {f.name for f in dataclasses.fields(params_cls)} if params_cls is not None else set()
        for key in old:
            value, name = out.pop(key), key[len(group) + 1 :]
            if name in keep:
                out[f"{group}.params.{name}"] = value
    return out


def _moved(dotted: str) -> str:
    """One line for a scaling parameter given under its flat key of earlier versions."""
    prefix, _, name = dotted.rpartition(".")
    return (
        f"'{dotted}' is now '{prefix}.params.{name}': a RoPE scaling method's own parameters are nested under "
        f"params (override: +{prefix}.params.{name}=VALUE)"
    )


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: invalid value {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(map(str, args))}")
        return value
    if origin is list:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if tp in (PosConfig, DataConfig):  # already built by config_from_dict with the scheme's/source's own class
            return value
        return build_dataclass(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{key}: expected a finite number, got {value!r}")
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if tp is Any:
        return value
    raise TypeError(f"unsupported config type {tp!r} for {key}")  # a bug in a schema, not a user error


def suggest(name: str, choices: typing.Iterable[str]) -> str:
    """' (did you mean pos.base?)' for the closest of `choices` to `name` (difflib's ratio >= 0.6), else ''."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _unknown(dotted: str, where: str, valid: list[str], what: str) -> str:
    """One line: "unknown config key 'pos.bse' (did you mean pos.base?; valid keys: base, ...)". `where` is the
    part of `dotted` that is wrong (the key itself, or the group it names), `valid` what that part may be."""
    prefix, _, name = where.rpartition(".")
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f"did you mean {prefix + '.' if prefix else ''}{close[0]}?; " if close else ""
    lead = f"no group '{where}'; " if where != dotted else ""
    return f"unknown config key '{dotted}' ({lead}{hint}{what}: {', '.join(valid) or 'none'})"


def unknown_key_message(dotted: str, groups: typing.Mapping[str, type] | None = None) -> str:
    """One line for an unknown dotted key: the valid keys (or groups) at the level where it goes wrong, and the
    closest of them ("unknown config key 'pos.bse' (did you mean pos.base?; valid keys: base, ...)").

    `groups` gives the class a composition actually uses for a group whose schema here is only the base class
    (`{"pos": RopeConfig}` for `pos=rope`: `run.config_load.unknown_override_message` finds them); without it
    `pos.*` is checked against `PosConfig`, which has only `name`. A RoPE scaling parameter under its flat key of
    earlier versions (`extend.beta_fast`) names its new key; one under `params` that the default config does not
    list (`extend.params.beta_fast`) says to add it with Hydra's `+`."""
    parts = dotted.split(".")
    parent, name = ".".join(parts[:-1]), parts[-1]
    if name in param_fields():
        if parent in _SCALING_GROUPS:
            return _moved(dotted)
        if parent.endswith(".params") and parent[: -len(".params")] in _SCALING_GROUPS:
            return (
                f"'{dotted}' is not in the composed config (a scaling method's parameters are listed only when "
                f"given); add it with +{dotted}=VALUE"
            )
    cls: Any = Config
    for depth, part in enumerate(parts[:-1]):
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        nested = sorted(k for k, v in hints.items() if dataclasses.is_dataclass(v))
        where = ".".join(parts[: depth + 1])
        if part not in nested:
            return _unknown(dotted, where, nested, "groups")
        cls = (groups or {}).get(where, hints[part])
    valid = sorted(f.name for f in dataclasses.fields(cls) if f.init)
    return _unknown(dotted, dotted, valid, "valid keys")


_SCALING_GROUPS = ("extend", "pos.scaling")  # where configs hold a RoPE scaling

MAX_CONFIG_DIR_FILES = 10_000
MAX_CONFIG_FILE_BYTES = 2**20  # a config group or sweep file is a few hundred bytes


def check_config_dir(path: Path) -> None:
    """Before Hydra reads a user's `--config-dir`: `ConfigError` (one line naming the file) unless it is a
    directory whose YAML files are each a regular file of safe YAML (no `!!python/...` tags: nothing is ever
    constructed from them), at most `MAX_CONFIG_FILE_BYTES`, not nested absurdly deep, and a mapping (or empty).
    Hydra's own loader would otherwise end in a 100-line traceback, or block on a FIFO."""
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(f"--config-dir {root}: {'not a directory' if root.exists() else 'no such directory'}")
    files = sorted(f for f in root.rglob("*") if f.suffix in (".yaml", ".yml"))
    if len(files) > MAX_CONFIG_DIR_FILES:
        raise ConfigError(f"--config-dir {root}: more than {MAX_CONFIG_DIR_FILES} YAML files; is it a config dir?")
    for file in files:
        if file.is_dir():
            continue
        doc = load_yaml(file, what="config file", max_bytes=MAX_CONFIG_FILE_BYTES, max_depth=32)
        if doc is not None and not isinstance(doc, dict):
            raise ConfigError(f"{file}: config file is not a mapping of keys to values ({type(doc).__name__})")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _check_finite(obj: Any, group: str) -> None:
    """`ConfigError` naming the first float field (or float in a list field) of dataclass `obj` that is NaN/inf."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        values = value if isinstance(value, list | tuple) else [value]
        for v in values:
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{group}.{f.name} must be a finite number, got {value}")


def _check_magnitude(obj: Any, group: str) -> None:
    """`ConfigError` naming the first number field (or number in a list field) of dataclass `obj` beyond
    ±MAX_MAGNITUDE (seeds have their own range, torch's: MAX_SEED)."""
    for f in dataclasses.fields(obj):
        if f.name.endswith("seed"):
            continue
        value = getattr(obj, f.name)
        for v in value if isinstance(value, list | tuple) else [value]:
            if isinstance(v, int | float) and not isinstance(v, bool) and abs(v) > MAX_MAGNITUDE:
                Bound(-MAX_MAGNITUDE, MAX_MAGNITUDE).check(v, f"{group}.{f.name}")


def positive(obj: Any, group: str, *names: str) -> None:
    for n in names:
        if getattr(obj, n) < 1:
            raise ConfigError(f"{group}.{n} must be >= 1, got {getattr(obj, n)}")


def non_negative(obj: Any, group: str, *names: str) -> None:
    for n in names:
        if getattr(obj, n) < 0:
            raise ConfigError(f"{group}.{n} must be >= 0, got {getattr(obj, n)}")


def _probability(obj: Any, group: str, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        if not 0.0 <= v <= 1.0:
            raise ConfigError(f"{group}.{n} must be in [0, 1], got {v}")


# ----------------------------------------------------------------------------------------------------------------
# Serialisation.


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict (YAML/JSON-safe) of a config."""
    return dataclasses.asdict(cfg)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict (`config_to_dict`) as dotted keys: {"model": {"d_model": 128}} -> {"model.d_model": 128}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def config_to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


ROOT_CONFIG = "config"  # configs/config.yaml, the root that every Hydra composition starts from


def config_dir() -> Path:
    """The packaged configs (inside the wheel) or, in a source checkout, the top-level `configs/`."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "configs", here.parent / "configs"):
        if (candidate / f"{ROOT_CONFIG}.yaml").is_file():
            return candidate
    raise ConfigError(f"posenc's configs/ directory was not found next to {here}; reinstall posenc")


def replace(cfg: Any, **changes: Any) -> Any:
    """`dataclasses.replace`, re-exported for readability at call sites."""
    return dataclasses.replace(cfg, **changes)
