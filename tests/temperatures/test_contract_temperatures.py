"""Contract of the attention-temperature registry (posenc_cli/temperatures): every registered entry, with no edit
here, gives fp32 factors that broadcast over q, is exactly 1 where its paper leaves the trained model alone, gives
the KV cache's new rows the full forward's factors (tables and whole models), and round-trips its parameter through
a state dict."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import torch

from posenc_cli.config import ModelConfig
from posenc_cli.errors import ConfigError
from posenc_cli.model import GPT
from posenc_cli.positional import config_class
from posenc_cli.temperatures import Temperature, from_model, registry
from posenc_cli.temperatures.floor_log import FloorLog

NAMES = sorted(registry())
L, H, VOCAB = 8, 2, 48
TINY = ModelConfig(d_model=32, n_layer=2, n_head=H, logn_length=L)
SELECTABLE = [n for n in typing.get_args(typing.get_type_hints(ModelConfig)["attn_scale"]) if n != "none"]


def model_config(name: str) -> ModelConfig:
    return dataclasses.replace(TINY, attn_scale=name, temperature_c=0.7 if name == "drope" else 0.0)


def sample(name: str) -> Temperature:
    """The entry as `model.attn_scale` builds it; an entry only a layout gives (floor-log) with small settings."""
    try:
        return registry()[name].from_model(model_config(name))
    except ConfigError:
        return FloorLog(0.5, 4) if name == "floor-log" else pytest.fail(f"add a sample of '{name}' here")


def parameter(t: Temperature, seed: int = 0) -> torch.Tensor | None:
    """The entry's parameter, moved away from its initial value (so a test cannot pass on the init alone)."""
    init = t.init_parameter(H)
    if init is None:
        return None
    return init + torch.rand(H, generator=torch.Generator().manual_seed(seed)) + 0.1


def table_rows(t: Temperature, T: int, q_start: int = 0, batched: bool = False) -> torch.Tensor | None:
    """Rows [q_start, T) of the entry's table for T tokens at the default ids ((B, T) ids when `batched`)."""
    index = torch.arange(T)
    table = t.table(index.expand(2, T) if batched else index, index, T)
    return None if table is None else table[..., q_start:, :]


def factors(t: Temperature, T: int, q_start: int = 0, batched: bool = False) -> torch.Tensor:
    return t.query_factor(table_rows(t, T, q_start, batched), parameter(t))


def test_model_attn_scale_names_registered_entries() -> None:
    assert set(SELECTABLE) <= set(NAMES)
    assert {"logn", "ssmax", "floor-log", "drope", "head-scale"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("batched", [False, True])
def test_factors_are_fp32_and_broadcast_over_q(name: str, batched: bool) -> None:
    t, T = sample(name), 3 * L
    f = factors(t, T, batched=batched)
    assert f.dtype == torch.float32
    q = torch.randn(2, H, T, 4, dtype=torch.bfloat16)
    out = t.apply(q, table_rows(t, T, batched=batched), parameter(t))
    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.broadcast_shapes(f.shape, q.shape) == q.shape


@pytest.mark.parametrize("name", NAMES)
def test_factor_is_one_where_the_paper_leaves_the_model_alone(name: str) -> None:
    t = sample(name)
    f = factors(t, 4 * L).expand(H, 4 * L, 1)  # (H, T, 1)
    below = t.unit_below()
    if below is None:  # a learned or constant temperature: only its parameter decides
        return
    assert torch.equal(f[:, :below], torch.ones(H, below, 1))
    assert not torch.allclose(f[:, below:], torch.ones_like(f[:, below:]))  # and it acts beyond


@pytest.mark.parametrize("name", NAMES)
def test_cache_rows_are_the_full_rows(name: str) -> None:
    t, T = sample(name), 3 * L
    full = factors(t, T).expand(H, T, 1)
    for q_start in (1, L, T - 1):
        torch.testing.assert_close(factors(t, T, q_start).expand(H, T - q_start, 1), full[:, q_start:], rtol=0, atol=0)


def lively(model: GPT, seed: int = 1) -> GPT:
    """Move every parameter off its initial value, so a wrong key or a missed parameter shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


@pytest.mark.parametrize("name", SELECTABLE)
def test_cached_decoding_equals_the_full_forward(name: str) -> None:
    torch.manual_seed(0)
    model = lively(GPT(model_config(name), config_class("nope")(), VOCAB, L))
    idx = torch.randint(0, VOCAB, (2, 3 * L), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model(idx)  # the cell: its own 3L tokens, which the cache is given
        cache, out, start = model.new_cache(3 * L), [], 0
        for n in (L + 1, 1, 3, 3 * L - L - 5):
            out.append(model(idx[:, start : start + n], cache=cache))
            start += n
    torch.testing.assert_close(torch.cat(out, dim=1), reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", [n for n in SELECTABLE if registry()[n].parameter is not None])
def test_parameter_round_trips_through_a_state_dict(name: str) -> None:
    cfg = model_config(name)
    key = f"blocks.0.attn.{registry()[name].parameter}"
    torch.manual_seed(0)
    a = lively(GPT(cfg, config_class("nope")(), VOCAB, L))
    torch.manual_seed(5)
    b = GPT(cfg, config_class("nope")(), VOCAB, L).eval()
    state = a.state_dict()
    assert state[key].shape == (H,) and state[key].dtype == torch.float32
    assert not torch.equal(state[key], b.state_dict()[key])
    b.load_state_dict(state)
    idx = torch.randint(0, VOCAB, (1, 2 * L), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(a(idx), b(idx))
    assert from_model(cfg) == registry()[name].from_model(cfg)
