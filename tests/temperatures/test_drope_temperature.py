"""DroPE's temperature (posenc_cli/temperatures/drope.py): the default `cell` form is the reference's one softmax
scale per forward, β = 1 + c·ln s with s = the cell's length / L (checked against a model whose q projection is
multiplied by β, which is what `SakanaAI/DroPE`'s `softmax_scale` does to every logit); the cell length reaches
full and cached forwards alike; the per-query form and the configs saved before the form existed are kept."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from posenc_cli.config import ModelConfig, config_to_dict
from posenc_cli.model import GPT
from posenc_cli.positional import config_class
from posenc_cli.run.config_load import config_from_dict
from posenc_cli.temperatures.drope import Drope, beta_at, drope_beta

L, VOCAB, C = 8, 48, 0.41
TINY = ModelConfig(d_model=32, n_layer=2, n_head=2, logn_length=L)


def lively(model: GPT, seed: int = 1) -> GPT:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


def drope_model(c: float = C, form: str = "cell") -> GPT:
    cfg = dataclasses.replace(TINY, attn_scale="drope", temperature_c=c, temperature_form=form)
    torch.manual_seed(0)
    return lively(GPT(cfg, config_class("nope")(), VOCAB, L))


def softmax_scaled(model: GPT, beta: float) -> GPT:
    """The same weights without a temperature, every layer's q projection × β: every logit × β, one softmax scale
    for every query, as the reference's `scaling = softmax_scale` (1/√d → β/√d)."""
    plain = GPT(TINY, config_class("nope")(), VOCAB, L).eval()
    plain.load_state_dict(model.state_dict())
    D = TINY.d_model
    with torch.no_grad():
        for block in plain.blocks:
            block.attn.qkv.weight[:D] *= beta
            block.attn.qkv.bias[:D] *= beta
    return plain


def tokens(T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(seed))


def test_beta_is_the_papers_formula_clamped_below_the_training_length() -> None:
    assert beta_at(0.412, 4.0) == pytest.approx(1 + 0.412 * math.log(4))
    assert beta_at(-0.15, 4.0) == pytest.approx(1 - 0.15 * math.log(4))
    assert beta_at(0.412, 0.5) == 1.0 and beta_at(0.412, 1.0) == 1.0


@pytest.mark.parametrize("T", [L // 2, L, 4 * L])
def test_the_default_form_is_one_softmax_scale_per_cell(T: int) -> None:
    model, idx = drope_model(), tokens(T)
    reference = softmax_scaled(model, beta_at(C, T / L))
    with torch.no_grad():
        torch.testing.assert_close(model(idx), reference(idx), atol=2e-5, rtol=0)


def test_the_cell_length_comes_from_the_evaluation_not_from_t() -> None:
    """A forward of L tokens in a 4L cell gets β(4) for every query, the first included."""
    model, idx = drope_model(), tokens(L)
    with torch.no_grad():
        got = model(idx, cell_length=4 * L)
        torch.testing.assert_close(got, softmax_scaled(model, beta_at(C, 4.0))(idx), atol=2e-5, rtol=0)
        assert not torch.allclose(got, model(idx), atol=1e-3)  # its own length would give β = 1


def test_cached_decoding_of_a_cell_equals_its_full_forward() -> None:
    """Prompt then one-token steps through the cache, the cell given once (`new_cache`), equal the full forward of
    the whole cell; without a given length the cache keeps its first forward's, not each step's one token."""
    model, idx = drope_model(), tokens(3 * L)
    with torch.no_grad():
        full = model(idx)  # the cell is these 3L tokens
        cache = model.new_cache(3 * L)
        steps = [model(idx[:, : 2 * L], cache=cache)] + [
            model(idx[:, t : t + 1], cache=cache) for t in range(2 * L, 3 * L)
        ]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=2e-5, rtol=0)
        cache = model.new_cache()
        first = model(idx[:, : 2 * L], cache=cache)
        step = model(idx[:, 2 * L : 2 * L + 1], cache=cache)
        assert cache.cell_length == 2 * L
        whole = model(idx[:, : 2 * L + 1], cell_length=2 * L)
        torch.testing.assert_close(torch.cat([first, step], dim=1), whole, atol=2e-5, rtol=0)
        with pytest.raises(ValueError, match="cell of 16 tokens, not 24"):
            model(idx[:, 2 * L + 1 : 2 * L + 2], cache=cache, cell_length=3 * L)


def test_the_per_query_form_is_kept_as_a_named_option() -> None:
    index = torch.arange(4 * L)
    t = Drope(C, L, "query")
    torch.testing.assert_close(t.table(index, index, 4 * L)[:, 0], drope_beta(index, C, L))
    assert t.unit_below() == L and Drope(C, L).unit_below() is None
    model, idx = drope_model(form="query"), tokens(4 * L)
    with torch.no_grad():  # the two forms differ beyond L (the 2.4958 vs 2.5200 at 4x)
        assert not torch.allclose(model(idx), drope_model()(idx), atol=1e-3)


def test_a_drope_config_saved_before_the_form_existed_loads_per_query() -> None:
    from posenc_cli.config import Config

    cfg = Config(model=dataclasses.replace(TINY, attn_scale="drope", temperature_c=C))
    raw = config_to_dict(cfg)
    assert raw["model"]["temperature_form"] == "cell"
    del raw["model"]["temperature_form"]  # what a run calibrated before the form existed holds
    assert config_from_dict(raw, saved=True).model.temperature_form == "query"
    assert config_from_dict(raw).model.temperature_form == "cell"  # a new config: the reference's form
    raw["model"]["temperature_c"] = -0.15
    assert config_from_dict(raw).model.temperature_c == -0.15  # c of either sign
