"""The corpus an evaluation scores: the run's own validation split, or another corpus given as data overrides.

`data_config_with_overrides` composes only the data group (`eval-extrapolate RUN data=text 'data.paths=[FILE]'`):
files named for evaluation are scored whole, as an evaluation-only corpus (`posenc_cli.data.sources.text`), and a
file the run trained on is refused (`check_held_out`). `CorpusCache` tokenizes each (data config, tokenizer) pair
once per command.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from posenc_cli.config import DataConfig, config_dir
from posenc_cli.data.cache import load_corpus
from posenc_cli.data.sources import build_data_config, config_class, source_class
from posenc_cli.data.sources import registry as source_registry
from posenc_cli.data.sources.text import TextDataConfig, trained_files_among
from posenc_cli.errors import ConfigError, DataError
from posenc_cli.run.config_load import dotlist_dict

if TYPE_CHECKING:
    from posenc_cli.data.cache import Corpus
    from posenc_cli.run.load import LoadedRun

__all__ = ["CorpusCache", "check_held_out", "data_config_with_overrides", "data_name"]


def data_config_with_overrides(base: DataConfig, overrides: Sequence[str]) -> DataConfig:
    """Compose only the data group: `data=NAME` starts from NAME's defaults (configs/data/NAME.yaml, or the registered
    source's own defaults where it has no group file, e.g. `data=tasks`), `data.KEY=VALUE` sets keys.

    Without `data=NAME` the run's own data config is the starting point, and its validation split is scored. Values
    use OmegaConf's dotlist grammar (lists as `[a,b]`, `null`, numbers).

    Held-out files are scored whole: `data=text 'data.paths=[held_out.txt]'` (or `data.paths=[...]` alone on a run
    trained on data=text) names files to evaluate on, not a corpus to split, so they become an evaluation-only
    corpus (`data.val_paths` = those files, no `data.paths`: every file is the validation stream, see
    `posenc_cli.data.sources.text`). Scoring the 2% tail that training would hold out instead asks for the split
    explicitly, with `data.val_fraction=...` or `data.val_paths=[...]` (the split training makes: the same corpus
    fingerprint as a run trained on exactly that config). `data=text 'data.val_paths=[held_out.txt]'` alone is the
    evaluation-only corpus itself. A file the run trained on is refused (`check_held_out`).
    """
    raw: dict[str, Any] = dataclasses.asdict(base)
    dotted: list[str] = []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key == "data":
            raw = _data_group_defaults(o.split("=", 1)[1])
        elif key.startswith("data."):
            dotted.append(o.lstrip("+~"))
        else:
            raise ConfigError(
                f"'{o}': eval-extrapolate takes only data overrides (data=NAME, data.KEY=VALUE); "
                "model, tokenizer and positions come from each run"
            )
    if dotted:
        raw.update(dotlist_dict(dotted, error_prefix="bad data override: ").get("data", {}))
    keys = {d.split("=", 1)[0] for d in dotted}
    split_asked = bool(keys & {"data.val_fraction", "data.val_paths"})
    if "data.paths" in keys and raw.get("source") == "text" and raw.get("paths") and not split_asked:
        raw = {**raw, "val_paths": list(raw["paths"]), "paths": []}  # the named files, whole
    # keys of the run's own source do not carry over to another one (data.source=stdlib on a data=text run)
    cfg = build_data_config(raw, drop_foreign=raw.get("source") != base.source)
    cfg.validate()
    return cfg


def check_held_out(data: DataConfig, trained: DataConfig, run: Path | str) -> None:
    """Refuse an evaluation-only corpus (files scored whole) holding a file the run trained on: its score would be
    on trained text, under a held-out label. The run's own held-out split is what it scores without overrides."""
    if not isinstance(data, TextDataConfig) or not data.evaluation_only:
        return
    trained_on = trained_files_among(data, trained)
    if trained_on:
        raise DataError(
            f"{trained_on[0].name} is in the training data of {run} (its data.paths): scored whole it would score "
            "text the run trained on; drop the data overrides to score the run's own validation split, or give "
            "data.val_fraction=F to score the file's held-out tail"
        )


DATACLASS_NODE = "/dataclass/data/"  # a data group file's generated node (run.config_compose)


def _data_group_defaults(name: str) -> dict[str, Any]:
    """The defaults `data=NAME` composes to: its group file, else the registered source's config defaults."""
    group = config_dir() / "data"
    path = group / f"{name}.yaml"
    if path.is_file():  # `defaults: [/dataclass/data/SOURCE@_here_, _self_]`, then what differs from them
        raw = yaml.safe_load(path.read_text()) or {}
        nodes = [d for d in raw.pop("defaults", []) if isinstance(d, str) and d.startswith(DATACLASS_NODE)]
        source = nodes[0].removeprefix(DATACLASS_NODE).split("@", 1)[0] if nodes else raw.get("source", name)
        base = dataclasses.asdict(config_class(source)()) if source in source_registry() else {}
        return {**base, **raw}
    if name in source_registry():
        return dataclasses.asdict(config_class(name)())
    options = ", ".join(sorted({p.stem for p in group.glob("*.yaml")} | set(source_registry())))
    raise ConfigError(f"data={name} is not a data config (available: {options})")


def data_name(cfg: DataConfig) -> str:
    """Short human name of a data config, stored with each entry."""
    return source_class(cfg.source).describe(cfg)


class CorpusCache:
    """Loads each (data config, tokenizer) corpus once per command, so five runs share one validation stream."""

    def __init__(self) -> None:
        self._corpora: dict[tuple[str, str], Corpus] = {}

    def get(self, data: DataConfig, run: LoadedRun, progress: Callable[[str, int, int], None] | None = None) -> Corpus:
        key = (json.dumps(dataclasses.asdict(data), sort_keys=True), str(run.tokenizer.fingerprint))
        if key not in self._corpora:
            self._corpora[key] = load_corpus(data, run.config.tokenizer, tokenizer=run.tokenizer, progress=progress)
        return self._corpora[key]
