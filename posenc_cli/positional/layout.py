"""A per-layer layout: which positional scheme, attention span and query temperature each layer uses.

`pos=layout pos.layers=[...]` (and the named presets in `positional/hybrids.py`) lists layer entries. Each entry is
a scheme's own options (`name` and its keys, e.g. `{name: rope, base: 1e6}`) plus the layer's:

- `span`: `full` (default), `sliding` or `chunked` (`positional.span`), `window` its size in tokens (W, C) > 0;
  unset, a sliding or chunked layer's window is `window_fraction` × the training length (written explicitly when
  the run is made, so the run records it);
- `temperature`: Llama 4's floor-log query temperature a (`positional.temperature.FloorLog`; 0: none), with
  `floor_scale` F in tokens > 0 (unset: the default window, as Llama 4 sets `floor_scale` equal to
  `attention_chunk_size`, both 8192).

The list repeats over the layers and is cut at `model.n_layer`, as `transformers` derives `layer_types` from a
pattern (Gemma 3: layer i is global when (i + 1) % 6 == 0), so 26 layers of a 6-entry pattern end in two local
layers; a list longer than `model.n_layer` is refused. Entries with equal scheme options share one scheme (one set
of tables per forward, one set of parameters), so a uniform layout is exactly the plain model.

The model never looks inside: it asks `layer_view(i, ctx)` for every layer (`LayerView`: scheme, its context, span,
temperature) and calls that scheme's hooks. A scheme that adds to the embeddings (learned, sinusoidal) acts before
any layer, so it can be a layout's only scheme but cannot be mixed with others.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from posenc_cli.config import ModelConfig, PosConfig, build_dataclass
from posenc_cli.errors import ConfigError
from posenc_cli.positional import build_scheme, register, scheme_class
from posenc_cli.positional.base import LayerView, PositionalScheme, PositionContext
from posenc_cli.positional.span import SPAN_KINDS, Span, SpanKind
from posenc_cli.temperatures.floor_log import FloorLog

LAYER_KEYS = ("span", "window", "temperature", "floor_scale")  # an entry's own keys; the rest are the scheme's


@dataclass(frozen=True)
class LayerEntry:
    """One parsed entry of `pos.layers`: the scheme's config and the layer's span and temperature settings."""

    pos: PosConfig
    span: SpanKind = "full"
    window: int | None = None
    temperature: float = 0.0
    floor_scale: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The entry as `pos.layers` holds it: the scheme's options, then the layer's keys."""
        return {**dataclasses.asdict(self.pos), "span": self.span, "window": self.window,
                "temperature": self.temperature, "floor_scale": self.floor_scale}  # fmt: skip


def parse_entry(raw: Any, prefix: str) -> LayerEntry:
    """`pos.layers[i]` -> a `LayerEntry`; raises `ConfigError` naming the key for anything malformed."""
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise ConfigError(f"{prefix} must be a mapping with a scheme 'name', e.g. {{name: rope}}; got {raw!r}")
    cls = scheme_class(raw["name"])
    if issubclass(cls, Layout):
        raise ConfigError(f"{prefix}.name={raw['name']} is a layout; a layer entry names one scheme")
    own = {k: raw[k] for k in LAYER_KEYS if k in raw}
    pos = build_dataclass(cls.config_cls, {k: v for k, v in raw.items() if k not in LAYER_KEYS}, prefix)
    pos.validate()
    entry = build_dataclass(LayerEntry, {"pos": pos, **own}, prefix)
    if entry.span not in SPAN_KINDS:
        raise ConfigError(f"{prefix}.span={entry.span!r} is not one of {', '.join(SPAN_KINDS)}")
    if entry.span == "full" and entry.window is not None:
        raise ConfigError(f"{prefix}.window={entry.window}: a full-attention layer has no window (see span)")
    if entry.window is not None and entry.window <= 0:
        raise ConfigError(f"{prefix}.window={entry.window}: a window is > 0 tokens (leave it unset for "
                          "window_fraction × the training length)")  # fmt: skip
    if entry.temperature < 0:
        raise ConfigError(f"{prefix}.temperature={entry.temperature} must be >= 0 (0: none)")
    if entry.floor_scale is not None and entry.floor_scale <= 0:
        raise ConfigError(f"{prefix}.floor_scale={entry.floor_scale} must be > 0 tokens (unset: the default window)")
    return entry


@dataclass(kw_only=True)
class LayoutConfig(PosConfig):
    """`pos.layers` (the pattern of layer entries) and `window_fraction` (the default window, × training length)."""

    name: str = "layout"
    layers: list[Any] = field(default_factory=lambda: [{"name": "rope"}])
    window_fraction: float = 0.25

    def entries(self) -> list[LayerEntry]:
        """The pattern's entries, parsed (`parse_entry`)."""
        if not isinstance(self.layers, list) or not self.layers:
            raise ConfigError("pos.layers must list at least one layer entry, e.g. [{name: rope}, {name: nope}]")
        return [parse_entry(raw, f"pos.layers[{i}]") for i, raw in enumerate(self.layers)]

    def validate(self) -> None:
        if not 0.0 < self.window_fraction <= 1.0:
            raise ConfigError(f"pos.window_fraction must be in (0, 1], got {self.window_fraction}")
        entries = self.entries()
        names = {e.pos.name for e in entries}
        embedders = sorted(n for n in names if "embed" in scheme_class(n).hooks)
        if embedders and any(e.pos != entries[0].pos for e in entries):
            raise ConfigError(f"pos.layers: {', '.join(embedders)} adds positions to the embeddings, which every "
                              "layer reads; it can be a layout's only scheme, not one layer's")  # fmt: skip

    def resolve(self, model: ModelConfig, train_length: int) -> None:
        entries = self.entries()
        check_fits(self, model.n_layer)
        default = default_window(self, train_length)
        resolved = []
        for e in entries:
            e.pos.resolve(model, train_length)
            window = e.window if e.window is not None or e.span == "full" else default
            floor = e.floor_scale if e.floor_scale is not None or not e.temperature else default
            resolved.append(dataclasses.replace(e, window=window, floor_scale=floor).as_dict())
        self.layers = resolved

    def layer_entries(self, n_layer: int) -> list[LayerEntry]:
        """One entry per layer: the pattern repeated and cut at `n_layer`."""
        pattern = self.entries()
        return [pattern[i % len(pattern)] for i in range(n_layer)]


def check_fits(cfg: LayoutConfig, n_layer: int) -> None:
    """Refuse a pattern longer than the model (repeating it cannot place every entry)."""
    if len(cfg.layers) > n_layer:
        raise ConfigError(f"pos.layers lists {len(cfg.layers)} layers but model.n_layer={n_layer}: the pattern "
                          "must fit the model (it repeats to n_layer, never drops entries)")  # fmt: skip


def default_window(cfg: LayoutConfig, train_length: int) -> int:
    """A sliding or chunked layer's window, and a temperature's floor, left unset: `window_fraction` × L tokens."""
    return max(1, round(cfg.window_fraction * train_length))


@register
class Layout(PositionalScheme):
    """Each layer's scheme, span and temperature from `pos.layers` (see the module doc)."""

    name = "layout"
    config_cls = LayoutConfig
    paper = "per-layer layouts (transformers `layer_types`; Llama 4, Gemma 3, Command A, SmolLM3)"

    def __init__(self, cfg: LayoutConfig, model: ModelConfig, train_length: int) -> None:
        super().__init__(cfg, model, train_length)
        check_fits(cfg, model.n_layer)  # as the config's resolve does: never a pattern cut short
        entries = cfg.layer_entries(model.n_layer)
        distinct: list[PosConfig] = []
        for e in entries:
            if e.pos not in distinct:
                distinct.append(e.pos)
        self.schemes = nn.ModuleList(build_scheme(p, model, train_length) for p in distinct)
        self.scheme_of_layer = tuple(distinct.index(e.pos) for e in entries)
        window = default_window(cfg, train_length)
        self.spans = tuple(Span(e.span, 0 if e.span == "full" else e.window or window) for e in entries)
        self.temperatures = tuple(
            FloorLog(e.temperature, e.floor_scale or window) if e.temperature else None for e in entries
        )
        self.hooks = tuple(h for h in ("embed", "rotate", "bias") if any(h in s.hooks for s in self.schemes))
        self.relative = all(s.relative for s in self.schemes)
        self.causal_only = any(s.causal_only for s in self.schemes)
        self.extrapolates = all(s.extrapolates for s in self.schemes)

    @property
    def max_length(self) -> int | None:
        limits = [s.max_length for s in self.schemes if s.max_length is not None]
        return min(limits) if limits else None

    def check_length(self, length: int) -> None:
        for s in self.schemes:
            s.check_length(length)

    def prepare(self, ctx: PositionContext) -> None:
        """One context per distinct scheme (its tables apart from the others'), prepared by that scheme."""
        children = []
        for s in self.schemes:
            child = PositionContext(
                ctx.positions, index=ctx.index, max_position=ctx.max_position, documents=ctx.documents
            )
            s.prepare(child)
            children.append(child)
        ctx.tables["layout"] = children

    def layer_view(self, layer: int, ctx: PositionContext) -> LayerView:
        """The entry's scheme's own view of layer `layer` (its per-layer part, as FoPE's coefficients), with the
        layout's span and temperature for that layer."""
        j = self.scheme_of_layer[layer]
        inner = self.schemes[j].layer_view(layer, ctx.tables["layout"][j])
        return LayerView(inner.scheme, inner.ctx, self.spans[layer], self.temperatures[layer])

    def describe_layers(self) -> list[str]:
        out = []
        for j, span, temp in zip(self.scheme_of_layer, self.spans, self.temperatures, strict=True):
            parts = [self.schemes[j].name, *([] if span.is_full else [span.describe()])]
            out.append(", ".join(parts + ([temp.describe()] if temp else [])))
        return out

    def embed(self, x: Tensor, ctx: PositionContext) -> Tensor:
        """The only scheme's embedding hook (a layout mixing schemes has none: `LayoutConfig.validate`)."""
        if len(self.schemes) == 1:
            return self.schemes[0].embed(x, ctx.tables["layout"][0])
        return x

    def rotate(self, q: Tensor, k: Tensor, ctx: PositionContext) -> tuple[Tensor, Tensor]:
        raise RuntimeError("a layout has no hooks of its own: call layer_view(i, ctx).scheme's")

    def bias(
        self, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, ctx: PositionContext
    ) -> Tensor | None:
        raise RuntimeError("a layout has no hooks of its own: call layer_view(i, ctx).scheme's")


def is_layout(scheme: PositionalScheme) -> bool:
    """Whether `scheme` gives its layers their own schemes (a `Layout`)."""
    return isinstance(scheme, Layout)
