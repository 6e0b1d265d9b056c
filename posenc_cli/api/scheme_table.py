"""`posenc schemes` as a function: one row per registered positional scheme (a new scheme file appears here)."""

from __future__ import annotations

__all__ = ["schemes"]


def schemes() -> list[dict[str, str]]:
    """One dict per registered scheme, in registry order: name, hooks, learned ("yes"/"no": it has parameters),
    extrapolates ("yes": it can read inputs longer than the training length, which says nothing about quality
    there), paper. Each scheme is built at the default model sizes (a layout: deep enough for its pattern) to read
    what it has; one that cannot be built keeps its class's hooks and "?" for learned."""
    # deferred: torch
    from posenc_cli.config import ModelConfig
    from posenc_cli.positional import registry
    from posenc_cli.positional.layout import is_layout

    rows = []
    for name, cls in registry().items():
        hooks, extrapolates, learned = ", ".join(cls.hooks) or "none", cls.extrapolates, "?"
        try:  # instantiate at the default sizes (a layout: deep enough for its pattern) to read what it has
            cfg = cls.config_cls(name=name)
            model = ModelConfig(n_layer=max(ModelConfig().n_layer, len(getattr(cfg, "layers", ()))))
            scheme = cls(cfg, model, 128)
            learned = "yes" if any(True for _ in scheme.parameters()) else "no"
            hooks, extrapolates = ", ".join(scheme.hooks) or "none", scheme.extrapolates  # a layout's: its layers'
            if is_layout(scheme):  # "per layer (rope, nope): rotate"
                names = dict.fromkeys(line.split(",")[0] for line in scheme.describe_layers())
                hooks = f"per layer ({', '.join(names)}): {hooks}"
        except Exception:
            pass
        rows.append(
            {
                "name": name,
                "hooks": hooks,
                "learned": learned,
                "extrapolates": "yes" if extrapolates else "no",
                "paper": cls.paper,
            }
        )
    return rows
