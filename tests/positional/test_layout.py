"""Per-layer layouts (`pos=layout` and the presets): a uniform layout is the plain model bit for bit, presets follow
their models' patterns, temperatures follow Llama 4's formula, and bad layouts are refused with one line."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from scheme_utils import hybrid_schemes, lively, n_layer_for, plain_schemes
from train_utils import tiny_overrides, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.config import Config, ModelConfig, TrainConfig
from posenc_cli.errors import ConfigError
from posenc_cli.model import GPT, build_model
from posenc_cli.positional import config_class, registry
from posenc_cli.positional.layout import LayoutConfig
from posenc_cli.positional.span import Span
from posenc_cli.positional.temperature import FloorLog
from posenc_cli.run.config_load import config_from_dict

TINY = ModelConfig(d_model=32, n_layer=3, n_head=2)
VOCAB, L = 48, 16
runner = CliRunner()


def uniform(name: str) -> LayoutConfig:
    return LayoutConfig(layers=[dataclasses.asdict(config_class(name)())])


@pytest.mark.parametrize("name", plain_schemes())
def test_a_uniform_layout_is_the_plain_model_bit_for_bit(name: str) -> None:
    """The same weights (the plain model's, under the layout's parameter names) give identical logits: at, below
    and (where the scheme reaches) beyond the training length, with explicit ids, in training mode with
    gradients, and decoding with the KV cache."""
    torch.manual_seed(0)
    plain = lively(GPT(TINY, config_class(name)(), VOCAB, L))
    layered = GPT(TINY, uniform(name), VOCAB, L)
    state = {k.replace("scheme.", "scheme.schemes.0.", 1): v for k, v in plain.state_dict().items()}
    layered.load_state_dict(state)
    layered.eval()
    reach = 2 * L if registry()[name].extrapolates else L
    idx = torch.randint(0, VOCAB, (2, reach), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for T in (L // 2, L, reach):
            assert torch.equal(plain(idx[:, :T]), layered(idx[:, :T])), T
        ids = torch.arange(L // 2) * 2
        assert torch.equal(plain(idx[:, : L // 2], position_ids=ids), layered(idx[:, : L // 2], position_ids=ids))
        for model in (plain, layered):
            cache = model.new_cache()
            model.decoded = torch.cat([model(idx[:, :5], cache=cache), model(idx[:, 5:9], cache=cache)], dim=1)
        assert torch.equal(plain.decoded, layered.decoded)
    plain.train(), layered.train()
    loss_p = plain(idx[:, :L]).logsumexp(-1).mean()
    loss_l = layered(idx[:, :L]).logsumexp(-1).mean()
    assert torch.equal(loss_p, loss_l)
    loss_p.backward(), loss_l.backward()
    grads = {k.replace("scheme.", "scheme.schemes.0.", 1): p.grad for k, p in plain.named_parameters()}
    for k, p in layered.named_parameters():
        assert (p.grad is None and grads[k] is None) or torch.equal(p.grad, grads[k]), k


def resolved(name: str, n_layer: int, seq_len: int = 32) -> Config:
    return config_from_dict({"pos": {"name": name}, "model": {"n_layer": n_layer}, "train": {"seq_len": seq_len}})


def test_presets_follow_their_models_patterns() -> None:
    """Llama 4 / Command A / SmolLM3: every 4th layer NoPE ((i + 1) % 4 == 0); Gemma 3: every 6th layer global with
    base 1e6, the rest sliding with base 1e4, the pattern repeated and cut (8 layers end in two local ones); windows,
    chunks and floors at L/4."""
    irope = build_model(resolved("irope", 8), VOCAB).scheme
    assert irope.describe_layers() == ["rope, chunked 8"] * 3 + ["nope, floor-log temperature a=0.1, F=8"] + [
        "rope, chunked 8"
    ] * 3 + ["nope, floor-log temperature a=0.1, F=8"]
    assert len(irope.schemes) == 2  # the RoPE layers share one scheme: one set of tables per forward
    swa = build_model(resolved("rnope-swa", 4), VOCAB).scheme
    assert swa.describe_layers() == ["rope, sliding 8"] * 3 + ["nope"]
    assert build_model(resolved("smollm3", 4), VOCAB).scheme.describe_layers() == ["rope"] * 3 + ["nope"]
    gemma = build_model(resolved("gemma3", 8), VOCAB).scheme
    assert gemma.describe_layers() == ["rope, sliding 8"] * 5 + ["rope"] + ["rope, sliding 8"] * 2
    bases = [gemma.schemes[j].cfg.base for j in gemma.scheme_of_layer]
    assert bases == [1e4] * 5 + [1e6] + [1e4] * 2
    # the run's config records every layer's resolved window
    assert [e["window"] for e in resolved("gemma3", 6).pos.layers] == [8] * 5 + [None]


def test_floor_log_temperature_is_llama4s_formula() -> None:
    """1 + a·log1p(⌊(n + 1)/F⌋), transformers' Llama4TextAttention, computed here in plain Python."""
    temp = FloorLog(scale=0.1, floor=8)
    n = torch.arange(100)
    expected = torch.tensor([1 + 0.1 * math.log1p(math.floor((i + 1) / 8)) for i in range(100)])
    torch.testing.assert_close(temp.factor(n).double(), expected.double(), atol=1e-6, rtol=0)


def test_the_temperature_acts_only_from_the_floor_on() -> None:
    """A NoPE layer's temperature leaves the first F − 1 tokens' logits as they were and changes later ones."""
    layers = [{"name": "rope"}, {"name": "nope", "temperature": 0.5, "floor_scale": 6}]
    base = LayoutConfig(layers=[layers[0], {"name": "nope"}])
    torch.manual_seed(0)
    cold = GPT(TINY, base, VOCAB, L).eval()
    warm = GPT(TINY, LayoutConfig(layers=layers), VOCAB, L).eval()
    warm.load_state_dict(cold.state_dict())
    idx = torch.randint(0, VOCAB, (1, 12))
    with torch.no_grad():
        a, b = cold(idx), warm(idx)
    assert torch.equal(a[:, :5], b[:, :5]) and not torch.allclose(a[:, 5:], b[:, 5:])


def test_a_window_changes_logits_only_beyond_it() -> None:
    """A sliding-window layer equals the full layer at lengths up to W and differs after."""
    torch.manual_seed(0)
    full = GPT(TINY, LayoutConfig(layers=[{"name": "rope"}]), VOCAB, L).eval()
    windowed = GPT(TINY, LayoutConfig(layers=[{"name": "rope", "span": "sliding", "window": 4}]), VOCAB, L).eval()
    windowed.load_state_dict(full.state_dict())
    idx = torch.randint(0, VOCAB, (1, 10))
    with torch.no_grad():
        a, b = full(idx), windowed(idx)
    assert torch.equal(a[:, :4], b[:, :4]) and not torch.allclose(a[:, 4:], b[:, 4:])
    assert windowed.scheme.spans == (Span("sliding", 4),) * 3


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        ([{"name": "bogus"}], "unknown positional scheme pos=bogus"),
        ([{"name": "rope", "span": "sliding", "window": 0}], "pos.layers[0].window=0"),
        ([{"name": "rope", "span": "chunked", "window": -3}], "pos.layers[0].window=-3"),
        ([{"name": "rope", "span": "diagonal"}], "pos.layers[0].span='diagonal'"),
        ([{"name": "rope", "window": 4}], "a full-attention layer has no window"),
        ([{"name": "rope", "bse": 4}], "unknown config key 'pos.layers[0].bse'"),
        ([{"name": "learned"}, {"name": "rope"}], "learned adds positions to the embeddings"),
        ([{"name": "irope"}], "is a layout"),
        ([{"name": "rope"}] * 5, "pos.layers lists 5 layers but model.n_layer=4"),
        ([], "at least one layer entry"),
        (["rope"], "must be a mapping with a scheme 'name'"),
    ],
)
def test_bad_layouts_are_refused_naming_the_key(layers: list, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        config_from_dict({"pos": {"name": "layout", "layers": layers}})


def test_cli_refuses_a_bad_layout_with_one_line_and_writes_nothing(tmp_path: Path) -> None:
    for args in (
        ["pos=gemma3"],  # 6 entries, model=tiny has 4 layers
        ["pos=layout", "pos.layers=[{name:rope,span:sliding,window:0}]"],
        ["pos=layout", "pos.layers=[{name:ropee}]"],
    ):
        out = tmp_path / "run"
        result = runner.invoke(app, ["train", *args, "--out", str(out)])
        assert result.exit_code == 2, (args, result.output)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
        assert not out.exists()


@pytest.mark.integration  # end to end
@pytest.mark.parametrize("name", hybrid_schemes())
def test_every_preset_trains_and_evaluates_from_the_cli(name: str, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path)
    out = tmp_path / name
    n_layer = n_layer_for(name, 2)
    args = ["train", *tiny_overrides(corpus, steps=4), f"pos={name}", f"model.n_layer={n_layer}", "--out", str(out)]
    trained = runner.invoke(app, args)
    assert trained.exit_code == 0, trained.output
    saved = (out / "config.yaml").read_text()
    assert "layers:" in saved and ("window: " in saved or name in ("smollm3", "layout"))
    ev = runner.invoke(app, ["eval-extrapolate", str(out), "--lengths", "1,4", "--tokens", "128", "--device", "cpu"])
    assert ev.exit_code == 0, ev.output
    entries = json.loads((out / "eval" / "extrapolate.json").read_text())["entries"]
    assert {e["multiple"] for e in entries} == {1, 4}
    assert all(e["status"] == "ok" and math.isfinite(e["ppl"]) for e in entries), entries


def test_hybrids_are_listed_with_their_sources() -> None:
    out = runner.invoke(app, ["schemes"])
    assert out.exit_code == 0
    for name in ("irope", "rnope-swa", "smollm3", "gemma3"):
        assert name in out.output and registry()[name].paper.split(",")[0] in out.output


def test_config_round_trip_keeps_the_layout() -> None:
    cfg = resolved("irope", 4)
    again = config_from_dict(dataclasses.asdict(cfg), saved=True)
    assert again.pos == cfg.pos
    torch.manual_seed(0)
    a = build_model(cfg, VOCAB).eval()
    b = build_model(again, VOCAB).eval()
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, VOCAB, (1, 40))
    with torch.no_grad():
        assert torch.equal(a(idx), b(idx))
    assert Config(model=ModelConfig(n_layer=4), pos=config_class("irope")(), train=TrainConfig(seq_len=8)).pos.layers


def test_a_layout_is_causal_only_when_any_of_its_schemes_is() -> None:
    """One FoX layer makes the whole model refuse a non-causal forward; RoPE and NoPE layers alone do not."""
    idx = torch.randint(0, VOCAB, (1, 8))
    mixed = GPT(TINY, LayoutConfig(layers=[{"name": "fox"}, {"name": "rope"}]), VOCAB, 16)
    plain = GPT(TINY, LayoutConfig(layers=[{"name": "rope"}, {"name": "nope"}]), VOCAB, 16)
    assert mixed.scheme.causal_only and not plain.scheme.causal_only
    with torch.no_grad(), pytest.raises(ValueError, match="causal attention only"):
        mixed(idx, causal=False)
    with torch.no_grad():
        assert torch.isfinite(plain(idx, causal=False)).all()
