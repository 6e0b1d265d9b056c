"""Registry of RoPE frequency-scaling methods: `posenc extend --method NAME`, `pos.scaling.method`, export.

Every module in this package is one method: a `ScalingMethod` subclass registered with `@register`, with its typed
frozen parameter dataclass (`ScalingParams`), its inverse frequencies, attention factor, "regions" summary (for
`extend`'s before/after table) and `transformers` rope parameters (for `export` and `extend HF_DIR`). The modules are
imported when this package is, so adding a method is one new file: its `--method` choice, `--<name>` alias and
parameter flags, its config keys and its contract tests (tests/positional/test_scaling_contract.py) all come from here.

The package sits below `config` (it imports only torch and `errors`): `config.ExtendConfig` and the rope scheme's
`RopeScalingConfig` both carry the flat settings built here by `settings_class`, so a method's parameters are
declared once, in its params dataclass, and saved as before (`pos.scaling: {method, factor, original_length,
beta_fast, ...}`: every method's parameters, in method order). `posenc_cli.positional.scaling` re-exports the
public entry point `scaled_inv_freq` for code outside posenc.

Formulas: ../shared/reference/rope-scaling.md. Convention: the attention factor multiplies both cos and sin (so
attention logits scale by its square), as in `transformers`' `_compute_*_parameters`, whose numbers these functions
reproduce (tests/positional/test_scaling.py). Notation: d = rotary dim (`head_dim`), s = `factor`,
L = `original_length`, inv_k = base^(-2k/d), k = 0..d/2-1. Everything is computed in float64 and returned as float32
on the CPU; callers move it to their device.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import pkgutil
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

import torch
from torch import Tensor

from posenc_cli.errors import ConfigError

__all__ = [
    "NONE",
    "ParamField",
    "RopeScalingConfig",
    "ScalingMethod",
    "ScalingParams",
    "TransformersRope",
    "base_inv_freq",
    "frequency_regions",
    "frequency_summary",
    "get_method",
    "method_names",
    "ntk_inv_freq",
    "param",
    "param_fields",
    "register",
    "registry",
    "scaled_inv_freq",
    "scaled_inv_freq_for",
    "settings_class",
]

NONE = "none"  # plain RoPE: the absence of a scaling method (a config value, not a registry entry)
Regions = dict[str, int]  # frequency pairs that keep / blend / interpolate, summing to d/2


# ---------------------------------------------------------------------------------------------- what a method is


@dataclass(frozen=True, kw_only=True)
class ScalingParams:
    """A method's own parameters; subclasses add fields made with `param` (a method without any keeps this)."""


def param(default: Any, *, help: str, metavar: str | None = None, positive: bool = False, saved: bool = True) -> Any:
    """A `ScalingParams` field. `help`: its `extend` flag's help; `positive`: `extend` requires it > 0 when set;
    `saved: False`: accepted by `scaled_inv_freq` (a `transformers` option) but not a config key or CLI flag."""
    return field(default=default, metadata={"help": help, "metavar": metavar, "positive": positive, "saved": saved})


@dataclass(frozen=True)
class TransformersRope:
    """A scaled RoPE in `transformers`' terms (`rope_parameters` in 5.x, `rope_scaling` in 4.x)."""

    parameters: dict[str, Any]  # rope_type and its keys, without rope_theta; rope_type "default" = plain RoPE
    theta_scale: float  # rope_theta is multiplied by this (static NTK's base change; 1 for the others)
    max_position_embeddings: int


class ScalingMethod:
    """One RoPE scaling method. Subclasses set the class attributes and override `inv_freq` (and any other hook
    whose default does not fit); `params` is always an instance of `params_cls`, with defaults filled in."""

    name: ClassVar[str]
    title: ClassVar[str]  # how --help names it (its panel of flags), e.g. "YaRN"
    summary: ClassVar[str]  # one line for --help
    paper: ClassVar[str]
    published: ClassVar[str]  # ISO date of its first publication: the registry lists methods oldest first
    params_cls: ClassVar[type[ScalingParams]] = ScalingParams
    min_rotary_dim: ClassVar[int] = 2
    length_dependent: ClassVar[bool] = False  # frequencies depend on the sequence length (dynamic)
    identity_at_one: ClassVar[bool] = True  # factor 1 gives plain RoPE by definition (up to L if length-dependent)
    rope_type: ClassVar[str | None] = None  # transformers' rope type (None: not exportable)

    def inv_freq(
        self, p: Any, head_dim: int, base: float, factor: float, original_length: int, seq_len: int | None
    ) -> Tensor:
        """(d/2,) float64 scaled inverse frequencies."""
        raise NotImplementedError

    def attention_factor(self, p: Any, factor: float, original_length: int) -> float:
        """Factor on cos and sin (logits scale by its square)."""
        return 1.0

    def regions(self, p: Any, head_dim: int, base: float, factor: float, original_length: int) -> Regions:
        """How many pairs keep inv_k, are blended, or are fully interpolated (inv_k/s), for factor > 1."""
        raise NotImplementedError

    def transformers(self, p: Any, factor: float, original_length: int, rotary_dim: int) -> TransformersRope | None:
        """The same scaling as `transformers` rope parameters; None when it has no rope type for it."""
        return None


_REGISTRY: dict[str, ScalingMethod] = {}
M = TypeVar("M", bound=type[ScalingMethod])


def register(cls: M) -> M:
    """Class decorator: make `cls` selectable as `--method <cls.name>` / `pos.scaling.method=<cls.name>`."""
    if cls.name == NONE or (cls.name in _REGISTRY and type(_REGISTRY[cls.name]) is not cls):
        raise RuntimeError(f"RoPE scaling method '{cls.name}' registered twice")
    _REGISTRY[cls.name] = cls()
    return cls


def registry() -> dict[str, ScalingMethod]:
    """Every method by name, oldest publication first."""
    return dict(sorted(_REGISTRY.items(), key=lambda kv: (kv[1].published, kv[0])))


def method_names() -> tuple[str, ...]:
    return tuple(registry())


def get_method(name: str) -> ScalingMethod:
    if name not in _REGISTRY:
        raise ConfigError(f"unknown RoPE scaling method '{name}' (available: {', '.join((NONE, *method_names()))})")
    return _REGISTRY[name]


@dataclass(frozen=True)
class ParamField:
    """One method parameter as the settings dataclass and the `extend` CLI see it."""

    name: str
    type: Any  # resolved annotation
    default: Any
    method: str  # the first method declaring it (the CLI's help panel)
    help: str
    metavar: str | None
    positive: bool
    saved: bool


def param_fields(*, saved_only: bool = True) -> dict[str, ParamField]:
    """Every method's parameters by name, in method order (a name two methods share must agree in type and default)."""
    out: dict[str, ParamField] = {}
    for method in registry().values():
        hints = typing.get_type_hints(method.params_cls)
        for f in dataclasses.fields(method.params_cls):
            meta = f.metadata
            pf = ParamField(
                f.name, hints[f.name], f.default, method.name, meta.get("help", ""), meta.get("metavar"),
                meta.get("positive", False), meta.get("saved", True),
            )  # fmt: skip
            if saved_only and not pf.saved:
                continue
            if f.name in out and (out[f.name].type, out[f.name].default) != (pf.type, pf.default):
                raise RuntimeError(f"RoPE scaling parameter '{f.name}' declared differently by two methods")
            out.setdefault(f.name, pf)
    return out


def make_params(method: ScalingMethod, values: dict[str, Any]) -> ScalingParams:
    """`method.params_cls` from flat values (None or absent: the default; other methods' keys are ignored)."""
    hints = typing.get_type_hints(method.params_cls)
    kwargs = {}
    for f in dataclasses.fields(method.params_cls):
        value = values.get(f.name)
        if value is not None:
            kwargs[f.name] = _as_type(hints[f.name], value)
    return method.params_cls(**kwargs)


def _as_type(tp: Any, value: Any) -> Any:
    args = set(typing.get_args(tp)) - {type(None)} if typing.get_origin(tp) in (typing.Union, types.UnionType) else {tp}
    if float in args:
        return float(value)
    if bool in args:
        return bool(value)
    return value


# ---------------------------------------------------------------------------------------- shared maths helpers


def base_inv_freq(head_dim: int, base: float) -> Tensor:
    """inv_k = base^(-2k/d), (d/2,) float64."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim  # (d/2,)
    return base**-exponents


def ntk_inv_freq(head_dim: int, base: float, scale: float) -> Tensor:
    """NTK-aware base change base' = base · scale^(d/(d-2)) (YaRN paper Eq. 16); pair k is divided by s^(2k/(d-2))."""
    return base_inv_freq(head_dim, base * scale ** (head_dim / (head_dim - 2)))


def _check_common(
    method: str, head_dim: int, base: float, factor: float, original_length: int, params: dict[str, object]
) -> ScalingMethod | None:
    unknown = set(params) - set(param_fields(saved_only=False))
    if unknown:
        raise ConfigError(f"unknown RoPE scaling parameter(s): {', '.join(sorted(unknown))}")
    spec = None if method == NONE else get_method(method)
    if head_dim < 2 or head_dim % 2:
        raise ConfigError(f"RoPE rotary dim must be even and >= 2, got {head_dim}")
    if spec is not None and head_dim < spec.min_rotary_dim:
        raise ConfigError(f"RoPE scaling '{method}' needs a rotary dim >= {spec.min_rotary_dim}, got {head_dim}")
    if not base > 1.0:
        raise ConfigError(f"RoPE base must be > 1, got {base}")
    if not factor >= 1.0:
        raise ConfigError(f"RoPE scaling factor must be >= 1, got {factor}")
    if original_length < 1:
        raise ConfigError(f"RoPE scaling original_length must be >= 1, got {original_length}")
    return spec


# ------------------------------------------------------------------------------------------ the public entry points


def scaled_inv_freq(
    method: str,
    head_dim: int,
    base: float,
    factor: float,
    original_length: int,
    seq_len: int | None = None,
    **params: float | bool | None,
) -> tuple[Tensor, float]:
    """(inv_freq (head_dim//2,) float32, attention_factor) of a scaled RoPE; same contract as `transformers`.

    The attention factor multiplies both cos and sin, so attention logits scale by attention_factor². `method` is
    "none" (inv_k = base^(-2k/d), attention 1) or a registered method (see its module for its formula);
    `seq_len` matters only to length-dependent methods (dynamic: recompute it per sequence length). `params` may
    hold any method's parameters (None means the default; those the method does not use are ignored). Raises
    ConfigError for an unknown method or parameter, factor < 1 or bad parameters.
    """
    spec = _check_common(method, head_dim, base, factor, original_length, params)
    if spec is None:
        return base_inv_freq(head_dim, base).to(torch.float32), 1.0
    p = make_params(spec, params)
    inv = spec.inv_freq(p, head_dim, base, factor, original_length, seq_len)
    return inv.to(torch.float32), spec.attention_factor(p, factor, original_length)


def scaled_inv_freq_for(
    cfg: Any, head_dim: int, base: float, train_length: int, seq_len: int | None = None
) -> tuple[Tensor, float]:
    """`scaled_inv_freq` for a scaling config; L = cfg.original_length, or `train_length` when that is None."""
    original_length = cfg.original_length if cfg.original_length is not None else train_length
    return scaled_inv_freq(cfg.method, head_dim, base, cfg.factor, original_length, seq_len, **cfg.param_values())


def frequency_regions(
    method: str, head_dim: int, base: float, factor: float, original_length: int, **params: float | bool | None
) -> Regions:
    """How many of the d/2 frequency pairs keep their frequency, are blended, or are fully interpolated (inv_k/s).

    none, or factor 1: all keep; otherwise the method's own `regions` (see its module).
    Returns dict(keep=int, blend=int, interpolate=int) summing to head_dim // 2.
    """
    spec = _check_common(method, head_dim, base, factor, original_length, params)
    if spec is None or factor == 1.0:
        return {"keep": head_dim // 2, "blend": 0, "interpolate": 0}
    return spec.regions(make_params(spec, params), head_dim, base, factor, original_length)


def frequency_summary(
    method: str, head_dim: int, base: float, factor: float, original_length: int, **params: float | bool | None
) -> tuple[float, Regions, tuple[float, float]]:
    """(attention factor, regions, longest wavelength in tokens before/after) for `extend`'s before/after table;
    a length-dependent method is shown at s·L tokens. Raises ConfigError for bad parameters."""
    spec = get_method(method)
    before, _ = scaled_inv_freq(NONE, head_dim, base, 1.0, original_length)
    seq_len = round(factor * original_length) if spec.length_dependent else None
    after, attention = scaled_inv_freq(method, head_dim, base, factor, original_length, seq_len, **params)
    regions = frequency_regions(method, head_dim, base, factor, original_length, **params)
    wavelengths = (2 * math.pi / float(before.min()), 2 * math.pi / float(after.min()))
    return float(attention), regions, wavelengths


# ------------------------------------------------------------------------------------------ the settings dataclass


def _param_values(self: Any) -> dict[str, Any]:
    """Every method's parameters, by name (what `scaled_inv_freq`'s **params takes)."""
    return {name: getattr(self, name) for name in param_fields()}


def _params(self: Any) -> ScalingParams | None:
    """The chosen method's typed parameters (None for "none")."""
    return None if self.method == NONE else make_params(get_method(self.method), self.param_values())


def settings_class(name: str, *, method: str, factor: float, allow_none: bool, doc: str, module: str) -> type:
    """A kw-only dataclass `name` of flat scaling settings: method, factor, original_length, then every registered
    method's parameters (one flat mapping, as config.yaml has always saved them). Subclass it to add fields;
    `module` is where it is bound to `name` (for pickling)."""
    names = (NONE, *method_names()) if allow_none else method_names()
    fields: list[tuple[str, Any, Any]] = [
        ("method", Literal[names], field(default=method)),  # type: ignore[valid-type]
        ("factor", float, field(default=factor)),
        ("original_length", int | None, field(default=None)),
    ]
    fields += [(f.name, f.type, field(default=f.default)) for f in param_fields().values()]
    namespace = {"__doc__": doc, "__module__": module, "param_values": _param_values, "params": property(_params)}
    return dataclasses.make_dataclass(name, fields, kw_only=True, namespace=namespace)


def _load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_load_all()  # the settings classes below need every method's parameters

RopeScalingConfig = settings_class(
    "RopeScalingConfig",
    method=NONE,
    factor=1.0,
    allow_none=True,
    module=__name__,
    doc="How a RoPE checkpoint's frequencies are rescaled (`pos.scaling`); `method: none` is a plain RoPE model.",
)
