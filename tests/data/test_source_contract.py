"""The contract every registered data source keeps (parametrised over the registry, so a new source is tested the
moment its file exists): it yields documents in both splits, its fingerprint is stable and follows its split, its
config round-trips through a run's config.yaml and its `configs/data/` group, and a saved config of the flat
`DataConfig` of earlier posenc versions (every source's keys on every source) still loads."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import datasets
import pytest
import yaml

from posenc_cli.config import Config, DataConfig, config_to_dict
from posenc_cli.data import sources
from posenc_cli.data.sources import DataSource, build_data_config, open_source, registry, source_class
from posenc_cli.data.sources import hf as hf_source
from posenc_cli.evaluation.tasks import registry as task_registry
from posenc_cli.run.config_compose import compose_dict
from posenc_cli.run.config_load import config_from_dict

# The keys of the flat DataConfig before each source had its own class (what older config.yaml files hold).
FLAT_KEYS = {
    "paths": [],
    "val_paths": [],
    "val_fraction": 0.02,
    "name": None,
    "config": None,
    "split": "train",
    "val_split": None,
    "text_column": "text",
    "cache_dir": None,
    "passkey_episodes": 8000,
    "passkey_min_len": 0,
    "passkey_max_len": 128,
    "passkey_digits": 5,
    "passkey_seed": 0,
}


def _hub(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [f"row {i}: some text\n" for i in range(40)]
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_dict({"text": rows}))
    monkeypatch.setattr(hf_source, "hub_reachable", lambda timeout=3.0: True)  # no network in tests


def _text_files(tmp_path: Path) -> list[str]:
    for i in range(12):
        (tmp_path / "docs" / f"d{i}.txt").parent.mkdir(exist_ok=True)
        (tmp_path / "docs" / f"d{i}.txt").write_text(f"document {i}\n" * (i + 1))
    return [str(tmp_path / "docs")]


# One small offline example per source: {source: (fields, setup)}; a registered source without one fails below.
EXAMPLES: dict[str, Callable[[Path, pytest.MonkeyPatch], dict]] = {
    "stdlib": lambda tmp, mp: {},
    "text": lambda tmp, mp: {"paths": _text_files(tmp)},
    "hf": lambda tmp, mp: (_hub(mp), {"name": "someone/corpus"})[1],
    "passkey": lambda tmp, mp: {"passkey_episodes": 40},
    "tasks": lambda tmp, mp: {"episodes": 40, "corpus_share": 0.25, "haystack": "corpus"},
    "algorithmic": lambda tmp, mp: {"examples": 40},
}


@pytest.fixture(params=sorted(registry()))
def source(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def example(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_stdlib: Path) -> DataConfig:
    assert source in EXAMPLES, f"data source '{source}' has no example in tests/data/test_source_contract.py"
    fields = EXAMPLES[source](tmp_path, monkeypatch)
    cfg = source_class(source).config_cls(val_fraction=0.25, **fields)
    cfg.validate()
    return cfg


def test_each_source_yields_documents_in_both_splits(example: DataConfig, tmp_path: Path) -> None:
    opened = open_source(example, tmp_path / "cache", None)
    train, val, method = opened.documents()
    assert train.count > 0 and val.count > 0 and isinstance(method, str) and method
    docs = [d for batch in train.batches() for d in batch]
    assert len(docs) == train.count and all(isinstance(d, str) for d in docs)
    assert opened.info["source"] == example.source


def test_fingerprint_is_stable_and_follows_the_split(example: DataConfig, tmp_path: Path) -> None:
    first = open_source(example, tmp_path / "cache", None).fingerprint
    assert first == open_source(dataclasses.replace(example), tmp_path / "cache", None).fingerprint
    other = dataclasses.replace(example, val_fraction=0.5)
    assert open_source(other, tmp_path / "cache", None).fingerprint != first
    moved = dataclasses.replace(example, cache_dir=str(tmp_path / "elsewhere"))  # where it is cached is no content
    assert open_source(moved, tmp_path / "cache", None).fingerprint == first


def test_config_round_trips(example: DataConfig) -> None:
    cls = source_class(example.source).config_cls
    assert type(example) is cls and issubclass(cls, DataConfig)
    saved = yaml.safe_load(yaml.safe_dump(config_to_dict(Config(data=example))))
    assert config_from_dict(saved, saved=True).data == example
    assert config_from_dict(saved).data == example


def test_group_file_holds_exactly_the_source_defaults(source: str) -> None:
    """`data=<source>` composes to the class's defaults: from its group file where there is one (which starts from
    the class's node and states only differences: tests/run/test_config_compose.py), else from the node generated
    from the class (one file per source)."""
    cls = source_class(source).config_cls
    assert compose_dict([f"data={source}"])["data"] == dataclasses.asdict(cls())


def test_a_source_without_a_group_file_is_a_hydra_option(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclasses.dataclass(kw_only=True)
    class TinyConfig(DataConfig):
        source: str = "tiny-test-source"
        words: int = 3

    class Tiny(DataSource):
        name = "tiny-test-source"
        config_cls = TinyConfig

    monkeypatch.setitem(sources._SOURCES._entries, Tiny.name, Tiny)  # registered for this test only
    try:
        raw = compose_dict(["data=tiny-test-source", "data.words=5"])
    finally:  # Hydra's config store is process-wide: leave no trace for later tests
        from hydra.core.config_store import ConfigStore

        ConfigStore.instance().repo.get("data", {}).pop("tiny-test-source.yaml", None)
    assert raw["data"] == {"source": "tiny-test-source", "val_fraction": 0.02, "cache_dir": None, "words": 5}


def test_a_saved_flat_config_still_loads(example: DataConfig) -> None:
    if example.source not in ("stdlib", "text", "hf", "passkey"):
        pytest.skip(f"data={example.source} came after the flat config: no flat config.yaml holds its keys")
    flat = {**FLAT_KEYS, **{k: v for k, v in dataclasses.asdict(example).items() if k in FLAT_KEYS}}
    flat["source"] = example.source
    assert build_data_config(flat, drop_foreign=True) == example


def test_describe_and_tasks(example: DataConfig) -> None:
    cls = source_class(example.source)
    assert isinstance(cls.describe(example), str) and cls.describe(example)
    assert cls.tasks and set(cls.tasks) <= set(task_registry())
