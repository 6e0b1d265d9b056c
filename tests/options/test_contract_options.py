"""Contract of the model-option registry (posenc_cli/options): every registered option, with no edit here, is a
`model=` switch that is off by default, equals the reference forward (options_reference.py, 1e-5 fp32) alone and
with the others, decodes through the KV cache as the full forward for every scheme and layout, trains (its
parameters get gradients), and a model with every option off is today's model, bit for bit."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import torch
import torch.nn.functional as F
from options_reference import reference_logits
from scheme_utils import lively, n_layer_for
from test_kv_cache import check

from posenc_cli.config import Config, ModelConfig
from posenc_cli.errors import ConfigError, NotExportable
from posenc_cli.model import GPT
from posenc_cli.options import LayerOptions, enabled, registry
from posenc_cli.positional import config_class
from posenc_cli.positional import registry as scheme_registry
from posenc_cli.run.export import check_exportable

NAMES = sorted(registry())
TINY = ModelConfig(d_model=32, n_layer=2, n_head=2)
VOCAB, L = 48, 16
SAMPLES = [(name, value) for name in NAMES for value in registry()[name].samples]
ALL_ON = {name: registry()[name].samples[0] for name in NAMES}


def model(pos: str = "nope", seed: int = 0, **options: object) -> GPT:
    """A lively tiny model of `pos` with `options` switched on (every parameter moved off its init)."""
    cfg = dataclasses.replace(TINY, n_layer=n_layer_for(pos), **options)
    cfg.validate()
    torch.manual_seed(seed)
    m = lively(GPT(cfg, config_class(pos)(), VOCAB, L))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if ".options." in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return m


def tokens(B: int = 2, T: int = 20) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(3))


def test_every_option_is_a_model_field_off_by_default() -> None:
    assert {"attn_sinks", "attn_gate", "qk_norm", "canon"} <= set(NAMES)
    defaults = ModelConfig()
    for name, cls in registry().items():
        assert getattr(defaults, name) == cls.off and not cls.enabled(defaults)
        assert cls.samples, f"give {name} the values that switch it on"
        hint = typing.get_type_hints(ModelConfig)[name]
        if typing.get_origin(hint) is typing.Literal:  # a choice: every value but `off` is a sample
            assert set(typing.get_args(hint)) - {cls.off} == set(cls.samples)
    assert enabled(defaults) == []


def test_every_option_off_is_todays_model_bit_for_bit() -> None:
    """No option parameter, the state dict keys of a model without options, and the logits of the forward of
    before: every road unchanged, so the plain SDPA forward of the same weights is equal bit for bit."""
    torch.manual_seed(0)
    m = GPT(TINY, config_class("rope")(), VOCAB, L).eval()
    keys = list(m.state_dict())
    assert not [k for k in keys if "options" in k]
    per_block = ["norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                 "attn.proj.bias", "norm2.weight", "norm2.bias", "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight",
                 "mlp.proj.bias"]  # fmt: skip
    assert keys == ["wte.weight"] + [f"blocks.{i}.{k}" for i in range(2) for k in per_block] + [
        "norm_f.weight", "norm_f.bias", "lm_head.weight"]  # fmt: skip
    idx = tokens()
    with torch.no_grad():
        ctx = m.context(idx)
        x = m.wte(idx)
        for block in m.blocks:  # the forward as it was: no hook between the sublayers
            h = block.norm1(x)
            B, T, D = h.shape
            q, k, v = (t.view(B, T, 2, D // 2).transpose(1, 2) for t in block.attn.qkv(h).split(D, dim=2))
            q, k = m.scheme.rotate(q, k, ctx)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
            x = x + block.attn.proj(y)
            x = x + block.mlp.proj(block.mlp.act(block.mlp.fc(block.norm2(x))))
        assert torch.equal(m(idx), m.lm_head(m.norm_f(x)))


@pytest.mark.parametrize("pos", ["nope", "rope"])
@pytest.mark.parametrize(("name", "value"), [*SAMPLES, ("all", None)])
def test_the_model_equals_the_reference_formulas(name: str, value: object, pos: str) -> None:
    m = model(pos, **(ALL_ON if name == "all" else {name: value}))
    idx = tokens()
    with torch.no_grad():
        torch.testing.assert_close(m(idx), reference_logits(m, idx), atol=1e-5, rtol=0)


@pytest.mark.parametrize("pos", sorted(scheme_registry()))
def test_options_compose_with_every_scheme_and_layout_through_the_cache(pos: str) -> None:
    """Every scheme and layout with every option on: the cached decoding is the full forward
    (tests/model/test_kv_cache.py's `check`: prefill + one token at a time, and pieces)."""
    options = dict(ALL_ON)
    if "normalise" in scheme_registry()[pos].hooks:  # refused sinks (test_attn_sinks.py)
        del options["attn_sinks"]
    check(model(pos, **options), 20 if scheme_registry()[pos].extrapolates else L)


@pytest.mark.parametrize("pos", ["rope", "alibi"])
@pytest.mark.parametrize(("name", "value"), SAMPLES)
def test_each_option_decodes_through_the_cache(name: str, value: object, pos: str) -> None:
    check(model(pos, **{name: value}), 20)


@pytest.mark.parametrize(("name", "value"), SAMPLES)
def test_every_option_trains(name: str, value: object) -> None:
    m = model("rope", **{name: value}).train()
    m(tokens()).logsumexp(-1).mean().backward()
    params = {n: p for n, p in m.named_parameters() if ".options." in n}
    assert params or value == "l2", f"{name}={value} has no parameter"
    for n, p in params.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, n


@pytest.mark.parametrize(("name", "value"), SAMPLES)
def test_option_parameters_round_trip_through_a_state_dict(name: str, value: object) -> None:
    a, b = model("rope", seed=0, **{name: value}), model("rope", seed=5, **{name: value})
    b.load_state_dict(a.state_dict())
    idx = tokens()
    with torch.no_grad():
        assert torch.equal(a(idx), b(idx))


def test_layer_options_are_empty_without_options_and_need_the_scheme_with_them() -> None:
    assert len(LayerOptions(TINY, 0, None)) == 0
    with pytest.raises(ValueError, match="scheme"):
        LayerOptions(dataclasses.replace(TINY, canon="A"), 0, None)


@pytest.mark.parametrize(
    ("override", "message"),
    [({"canon": "AE"}, "placements"), ({"canon": "AA"}, "placements"), ({"qk_norm_layers": "rotary"}, "qk_norm")],
)
def test_malformed_options_are_refused(override: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(TINY, **override).validate()


@pytest.mark.parametrize(("name", "value"), SAMPLES)
def test_export_refuses_a_run_with_an_option_in_one_line(name: str, value: object) -> None:
    cfg = Config()
    cfg.pos = config_class("rope")()
    cfg.model = dataclasses.replace(cfg.model, **{name: value})
    with pytest.raises(NotExportable, match=f"model.{name}="):
        check_exportable(cfg)
