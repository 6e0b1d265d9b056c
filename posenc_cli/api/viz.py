"""`posenc viz` as functions: draw a scheme's encoding, a run's attention, or attention by distance across runs; each
writes its figure and returns what the command shows beside it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc_cli.api.training import train_config
from posenc_cli.errors import ConfigError

if TYPE_CHECKING:
    from posenc_cli.analysis.viz_data import AttentionReport

__all__ = ["DEFAULT_DIR", "EncodingPicture", "viz_attention", "viz_compare", "viz_encoding"]

DEFAULT_DIR = Path("outputs/viz")  # where a figure goes when no `out` is given (`viz attention`: the run's viz/)


@dataclass(frozen=True)
class EncodingPicture:
    """`viz_encoding`'s result: the small grids a terminal shows (rich renderables, one per hook or layout block)
    and the figure written."""

    grids: list[Any]
    path: Path


def viz_encoding(
    overrides: Sequence[str] = (),
    run: str | Path | None = None,
    *,
    out: str | Path | None = None,
    length: int | None = None,
    head: int = 0,
    layer: int | None = None,
    config_dir: str | Path | None = None,
) -> EncodingPicture:
    """What a scheme's hooks do (added embeddings, rotation angles, score biases) at positions 0..`length`−1
    (default: the training length), of the config composed from `overrides` (its learned parameters seeded by
    train.seed) or of trained run `run`'s scheme; a per-layer layout draws each distinct scheme of its layers (only
    layer `layer`'s when given). Writes the figure to `out` (default outputs/viz/encoding-<scheme>.png)."""
    # deferred: torch and matplotlib
    from posenc_cli.analysis.viz import encoding_figure, layout_figure, layout_terminal, terminal_grids
    from posenc_cli.analysis.viz_data import encoding_data, layout_encoding, seeded_scheme
    from posenc_cli.positional.layout import is_layout
    from posenc_cli.report.plots import save_figure

    if run is not None:
        if overrides:
            raise ConfigError("overrides apply to composed configs, not to a run directory: give one or the other")
        # deferred: torch
        from posenc_cli.run.load import load_run

        loaded = load_run(run)
        scheme = loaded.model.scheme
        source = f"trained run {loaded.path.name}, step {loaded.meta.step}"
        seed = loaded.config.train.seed
    else:
        cfg = train_config(overrides, config_dir=config_dir)
        scheme = seeded_scheme(cfg)
        source, seed = None, cfg.train.seed
    n = length if length is not None else scheme.train_length
    if is_layout(scheme):  # one block per distinct scheme of the layers, then their spans and temperatures
        enc = layout_encoding(scheme, n, source=source, head=head, layer=layer, seed=seed)
        grids, figure, name = layout_terminal(enc), layout_figure(enc), enc.layout
    else:
        data = encoding_data(scheme, n, source=source, head=head, layer=layer or 0, seed=seed)
        grids, figure, name = terminal_grids(data), encoding_figure(data), data.scheme
    path = save_figure(figure, out or DEFAULT_DIR / f"encoding-{name}.png")
    return EncodingPicture(grids, Path(path))


def viz_attention(
    run: str | Path,
    *,
    length: int | None = None,
    layer: str = "all",
    head: str = "mean",
    windows: int = 4,
    out: str | Path | None = None,
    device: str = "auto",
) -> tuple[AttentionReport, Path]:
    """Attention maps of run `run` at its training length and at `length` (default 4×), side by side, and attention
    mass by distance, over `windows` held-out validation windows; `layer` K or all, `head` H, all or mean. Writes
    the figure to `out` (default RUN/viz/attention.png) and returns the report (mean attended distance per layer and
    length) with the figure's path."""
    # deferred: torch and matplotlib
    from posenc_cli.analysis.viz import attention_figure
    from posenc_cli.analysis.viz_data import attention_report
    from posenc_cli.report.plots import save_figure
    from posenc_cli.run.device import resolve_device
    from posenc_cli.run.load import load_run

    loaded = load_run(run, device=resolve_device(device))
    report = attention_report(loaded, length=length, layer=layer, head=head, windows=windows)
    path = save_figure(attention_figure(report), out or Path(run) / "viz" / "attention.png")
    return report, Path(path)


def viz_compare(
    paths: Sequence[str | Path],
    *,
    multiple: float = 4.0,
    windows: int = 4,
    out: str | Path | None = None,
    device: str = "auto",
) -> Path:
    """One small panel per run found below `paths` (runs or sweeps): attention mass by distance at 1× and at
    `multiple` × the training length. Writes the figure to `out` (default outputs/viz/attention-compare.png) and
    returns its path."""
    # deferred: torch and matplotlib
    from posenc_cli.analysis.viz import write_attention_comparison

    if multiple <= 0:
        raise ConfigError(f"--multiple must be > 0, got {multiple}")
    target = out or DEFAULT_DIR / "attention-compare.png"
    return Path(write_attention_comparison(paths, target, multiple=multiple, windows=windows, device=device))
