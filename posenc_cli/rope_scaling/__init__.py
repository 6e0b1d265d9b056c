"""Registry of RoPE frequency-scaling methods: `posenc extend --method NAME`, `pos.scaling.method`, export.

Every module in this package but `frequencies` (the entry points callers compute with: `scaled_inv_freq`,
`frequency_regions`, `frequency_summary`) is one method: a `ScalingMethod` subclass registered with `@register`, with
its typed frozen parameter dataclass (`ScalingParams`), its inverse frequencies, attention factor, "regions" summary
(for `extend`'s before/after table) and `transformers` rope parameters (for `export` and `extend HF_DIR`). The package
is a lazy `posenc_cli.registry.Registry`: importing it loads no method; the first lookup (`registry()`,
`get_method`, `param_fields`) imports every module of the package. So adding a method is one new file: its
`--method` choice, `--<name>` alias and parameter flags, its config keys and its contract tests
(tests/rope_scaling/test_scaling_contract.py) all come from here.

Configs hold a scaling nested per method (`ScalingSettings`): `{method, factor, original_length, params: {...}}`,
`params` being the chosen method's own typed parameters (`ScalingMethod.params_cls`, its defaults filled in);
`pos.scaling` is a `RopeScalingConfig`, `config.ExtendConfig` extends the same settings. `config.build_dataclass`
parses `params` with the method's class and reads the flat layout saved before (every method's parameters beside
`method`) too. The package sits below `config`; this module imports no torch (only `errors` and `registry`), and
neither does a method's module at its top (its maths imports torch and `frequencies` when called), so the config
schema, a method's flags and parameters, and with them `posenc <command> --help` (`extend`'s too), load without it
(tests/rope_scaling/test_scaling_contract.py).

Formulas: ../shared/reference/rope-scaling.md. Convention: the attention factor multiplies both cos and sin (so
attention logits scale by its square), as in `transformers`' `_compute_*_parameters`, whose numbers these functions
reproduce (tests/rope_scaling/test_scaling.py). Notation: d = rotary dim (`head_dim`), s = `factor`,
L = `original_length`, inv_k = base^(-2k/d), k = 0..d/2-1. Everything is computed in float64 and returned as float32
on the CPU; callers move it to their device.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from posenc_cli.errors import ConfigError
from posenc_cli.registry import Registry

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "NONE",
    "ParamField",
    "RopeScalingConfig",
    "ScalingMethod",
    "ScalingParams",
    "ScalingSettings",
    "TransformersRope",
    "get_method",
    "make_params",
    "method_names",
    "param",
    "param_fields",
    "params_class",
    "register",
    "registry",
]

NONE = "none"  # plain RoPE: the absence of a scaling method (a config value, not a registry entry)
Regions = dict[str, int]  # frequency pairs that keep / blend / interpolate, summing to d/2


# ---------------------------------------------------------------------------------------------- what a method is


@dataclass(frozen=True, kw_only=True)
class ScalingParams:
    """A method's own parameters; subclasses add fields made with `param` (a method without any keeps this)."""

    def values(self) -> dict[str, Any]:
        """The parameters by name (what `scaled_inv_freq`'s **params takes)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def param(default: Any, *, help: str, metavar: str | None = None, positive: bool = False) -> Any:
    """A `ScalingParams` field. `help`: its `extend` flag's help; `positive`: configs require it > 0 when set."""
    return field(default=default, metadata={"help": help, "metavar": metavar, "positive": positive})


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


M = TypeVar("M", bound=type[ScalingMethod])
_METHODS: Registry[type[ScalingMethod]] = Registry(__name__, "RoPE scaling method", skip=("frequencies",))
_INSTANCES: dict[type[ScalingMethod], ScalingMethod] = {}  # methods are stateless: one instance per class


def register(cls: M) -> M:
    """Class decorator: make `cls` selectable as `--method <cls.name>` / `pos.scaling.method=<cls.name>`."""
    if cls.name == NONE:
        raise RuntimeError(f"RoPE scaling method '{NONE}' is plain RoPE, not a method")
    return _METHODS.register(cls)


def registry() -> dict[str, ScalingMethod]:
    """Every method by name, oldest publication first (loads the package's modules on first use)."""
    classes = sorted(_METHODS.entries().values(), key=lambda c: (c.published, c.name))
    return {c.name: _INSTANCES.setdefault(c, c()) for c in classes}


def method_names() -> tuple[str, ...]:
    return tuple(registry())


def get_method(name: str) -> ScalingMethod:
    methods = registry()
    if name not in methods:
        raise ConfigError(f"unknown RoPE scaling method '{name}' (available: {', '.join((NONE, *methods))})")
    return methods[name]


@dataclass(frozen=True)
class ParamField:
    """One method parameter as the `extend` CLI sees it (one flag per name, whichever methods declare it)."""

    name: str
    type: Any  # resolved annotation
    default: Any
    method: str  # the first method declaring it (the CLI's help panel)
    help: str
    metavar: str | None
    positive: bool
    methods: tuple[str, ...] = ()  # every method declaring it


def param_fields() -> dict[str, ParamField]:
    """Every method's parameters by name, in method order (a name two methods share must agree in type and default)."""
    out: dict[str, ParamField] = {}
    for method in registry().values():
        hints = typing.get_type_hints(method.params_cls)
        for f in dataclasses.fields(method.params_cls):
            meta = f.metadata
            pf = ParamField(
                f.name, hints[f.name], f.default, method.name, meta.get("help", ""), meta.get("metavar"),
                meta.get("positive", False),
            )  # fmt: skip
            if f.name in out and (out[f.name].type, out[f.name].default) != (pf.type, pf.default):
                raise RuntimeError(f"RoPE scaling parameter '{f.name}' declared differently by two methods")
            first = out.get(f.name, pf)
            out[f.name] = dataclasses.replace(first, methods=(*first.methods, method.name))
    return out


def params_class(method: str) -> type[ScalingParams] | None:
    """The params class of `method`: `ScalingParams` for none, None for a name no method has."""
    if method == NONE:
        return ScalingParams
    methods = registry()
    return methods[method].params_cls if method in methods else None


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


# ------------------------------------------------------------------------------------------ the settings dataclass


@dataclass(kw_only=True)
class ScalingSettings:
    """A RoPE scaling as configs hold it: method, s, L (None: the run's training length) and the method's own
    typed parameters (`params`: the method's `params_cls`; left as the bare `ScalingParams` it becomes the
    method's defaults). Subclasses set the defaults (`pos.scaling`: none; `extend`: yarn x4)."""

    allow_none: ClassVar[bool] = True  # `method: none` (plain RoPE) is a valid value

    method: str = NONE
    factor: float = 1.0
    original_length: int | None = None
    params: ScalingParams = field(default_factory=ScalingParams)

    def __post_init__(self) -> None:
        cls = params_class(self.method)
        if cls is None or type(self.params) is cls:  # an unknown method is reported by validation, with the key
            return
        if type(self.params) is not ScalingParams or self.params.values():
            got = type(self.params).__name__
            raise ConfigError(f"RoPE scaling '{self.method}' takes {cls.__name__} parameters, got {got}")
        self.params = cls()

    def param_values(self) -> dict[str, Any]:
        """The method's parameters by name (what `scaled_inv_freq`'s **params takes)."""
        return self.params.values()


@dataclass(kw_only=True)
class RopeScalingConfig(ScalingSettings):
    """How a RoPE checkpoint's frequencies are rescaled (`pos.scaling`); `method: none` is a plain RoPE model."""
