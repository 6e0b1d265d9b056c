"""Extending a per-layer layout: `extend.layers` global (default: the full-attention RoPE layers, Gemma 3's rule)
or all; layers without RoPE and the layers the rule leaves out are untouched; refusals are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from train_utils import tiny_config, write_corpus

from posenc_cli.config import ExtendConfig, RemapConfig
from posenc_cli.errors import ConfigError
from posenc_cli.extension.extend import extend_run
from posenc_cli.extension.remap import remap_run
from posenc_cli.positional.layout import parse_entry
from posenc_cli.run.load import load_run

L = 16


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """gemma3 (6 layers), irope and smollm3 (4 layers) parents, two training steps each."""
    from posenc_cli.run.train import train

    root = tmp_path_factory.mktemp("layouts")
    corpus = write_corpus(root)
    out = {}
    for pos, n_layer in (("gemma3", 6), ("irope", 4), ("smollm3", 4), ("rope", 2)):
        out[pos] = root / pos
        train(tiny_config(corpus, pos=pos, model={"n_layer": n_layer}, steps=2), out[pos])
    return out


def scalings(run_dir: Path) -> list[str]:
    """Each layer entry's scaling method ('-' for a layer without RoPE)."""
    cfg = load_run(run_dir).config
    entries = [parse_entry(raw, "e") for raw in cfg.pos.layers]
    return [e.pos.scaling.method if e.pos.name == "rope" else "-" for e in entries]


def logits(run_dir: Path, T: int) -> torch.Tensor:
    run = load_run(run_dir)
    with torch.no_grad():
        return run.model(torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(0)))


def test_gemma3_scales_only_its_global_layer_by_default(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "g"
    result = extend_run(runs["gemma3"], out, ExtendConfig(method="yarn", factor=4.0))
    assert result.base == 1e6  # the report shows the global layer's RoPE
    assert scalings(out) == ["none"] * 5 + ["yarn"]
    record = json.loads((out / "meta.json").read_text())["extend"]
    assert record["layers"] == {"rule": "global", "entries": [5], "of": 6}
    # below the local window nothing but the global layer changed; the child's logits differ from the parent's
    assert not torch.equal(logits(out, 4 * L), logits(runs["gemma3"], 4 * L))
    every = tmp_path / "all"
    extend_run(runs["gemma3"], every, ExtendConfig(method="yarn", factor=4.0, layers="all"))
    assert scalings(every) == ["yarn"] * 6
    assert json.loads((every / "meta.json").read_text())["extend"]["layers"]["rule"] == "all"


def test_a_layout_without_global_rope_layers_is_refused_unless_all(runs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="has no global RoPE layer .*--layers all scales the windowed ones"):
        extend_run(runs["irope"], tmp_path / "refused", ExtendConfig(method="yarn", factor=2.0))
    assert not (tmp_path / "refused").exists()
    extend_run(runs["irope"], tmp_path / "all", ExtendConfig(method="yarn", factor=2.0, layers="all"))
    assert scalings(tmp_path / "all") == ["yarn"] * 3 + ["-"]


def test_smollm3_scales_its_rope_layers_and_leaves_nope(runs: dict[str, Path], tmp_path: Path) -> None:
    extend_run(runs["smollm3"], tmp_path / "s", ExtendConfig(method="linear", factor=2.0))
    assert scalings(tmp_path / "s") == ["linear"] * 3 + ["-"]


def test_a_plain_rope_run_keeps_its_record(runs: dict[str, Path], tmp_path: Path) -> None:
    extend_run(runs["rope"], tmp_path / "r", ExtendConfig(method="yarn", factor=2.0, layers="all"))
    assert "layers" not in json.loads((tmp_path / "r" / "meta.json").read_text())["extend"]
    assert load_run(tmp_path / "r").config.pos.scaling.method == "yarn"


def test_remapping_a_layout_remaps_its_rope_layers(runs: dict[str, Path], tmp_path: Path) -> None:
    remap = RemapConfig(method="self-extend", window=4, group=2)
    remap_run(runs["smollm3"], tmp_path / "se", remap)
    cfg = load_run(tmp_path / "se").config
    entries = [parse_entry(raw, "e") for raw in cfg.pos.layers]
    assert [e.pos.remap.method if e.pos.name == "rope" else "-" for e in entries] == ["self-extend"] * 3 + ["-"]
    with pytest.raises(ConfigError, match="has no global RoPE layer"):
        remap_run(runs["irope"], tmp_path / "no", remap)


def test_an_unknown_rule_is_one_line(runs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="extend.layers must be one of global, all"):
        extend_run(runs["gemma3"], tmp_path / "x", ExtendConfig(method="yarn", factor=2.0, layers="local"))  # type: ignore[arg-type]
