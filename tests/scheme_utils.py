"""Registry views for tests: the plain schemes, the per-layer hybrids, a layer count every hybrid fits, and `lively`."""

from __future__ import annotations

import torch
from torch import nn

from posenc_cli.positional import config_class, registry
from posenc_cli.positional.layout import LayoutConfig


def is_hybrid(name: str) -> bool:
    """Whether `pos=name` is a per-layer layout (`positional.layout`) rather than one scheme."""
    return issubclass(config_class(name), LayoutConfig)


def plain_schemes() -> list[str]:
    """Registered schemes that are one scheme (their hooks are tested directly)."""
    return [n for n in sorted(registry()) if not is_hybrid(n)]


def hybrid_schemes() -> list[str]:
    """Registered layouts: `layout` and the named presets."""
    return [n for n in sorted(registry()) if is_hybrid(n)]


def n_layer_for(name: str, n_layer: int = 2) -> int:
    """`n_layer`, or the preset's pattern length when longer (a pattern must fit the model)."""
    return max(n_layer, len(config_class(name)().layers)) if is_hybrid(name) else n_layer


def lively(model: nn.Module) -> nn.Module:
    """Zero-initialised scheme parameters (CoPE's e, ...) drawn from N(0, 0.5²) so that the scheme acts; eval mode."""
    with torch.no_grad():
        for p in model.scheme.parameters():
            if not p.any():
                p.normal_(std=0.5)
    return model.eval()
