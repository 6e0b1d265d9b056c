"""GPT: hooks-only positional information, initialisation, tied weights, the position-id boundary.

What every scheme must do inside the model (causality, training, bf16, longer inputs, position ids) is tested over
the registry in `test_scheme_contract.py`."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from scheme_utils import n_layer_for

import posenc_cli.attention
import posenc_cli.model
from posenc_cli.config import Config, ModelConfig, TrainConfig
from posenc_cli.model import GPT, build_model
from posenc_cli.positional import config_class, registry

TINY = ModelConfig(d_model=32, n_layer=2, n_head=2)


def make(name: str, mc: ModelConfig = TINY, vocab: int = 48, train_length: int = 16, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(mc, config_class(name)(), vocab, train_length)


def test_core_schemes_registered() -> None:
    assert {"alibi", "learned", "nope", "rope", "sinusoidal"} <= set(registry())


@pytest.mark.parametrize("module", [posenc_cli.model, posenc_cli.attention])
def test_model_code_names_no_scheme(module: object) -> None:
    path = Path(module.__file__)  # type: ignore[attr-defined]
    files = sorted(path.parent.glob("*.py")) if path.name == "__init__.py" else [path]  # a package: every module
    for file in files:
        source = file.read_text().lower()
        for name in registry():
            assert not re.search(rf"\b{re.escape(name.lower())}\b", source), f"'{name}' appears in {file}"


def test_tied_embeddings_and_parameter_count() -> None:
    model = make("nope")
    assert model.lm_head.weight is model.wte.weight
    d, L, V, m = 32, 2, 48, 4
    per_block = (3 * d * d + 3 * d) + (d * d + d) + (2 * m * d * d + m * d + d) + 2 * (2 * d)
    assert model.num_parameters() == V * d + L * per_block + 2 * d
    assert model.num_parameters(include_embedding=False) == L * per_block + 2 * d


def test_initialisation() -> None:
    mc = ModelConfig(d_model=256, n_layer=8, n_head=4, init_std=0.02)
    model = make("nope", mc=mc, vocab=512)
    assert abs(model.wte.weight.std().item() - 0.02) < 1e-3
    assert abs(model.blocks[0].attn.qkv.weight.std().item() - 0.02) < 1e-3
    resid = 0.02 / math.sqrt(2 * 8)
    assert abs(model.blocks[3].attn.proj.weight.std().item() - resid) < 2e-4
    assert abs(model.blocks[3].mlp.proj.weight.std().item() - resid) < 2e-4
    assert torch.all(model.blocks[0].attn.qkv.bias == 0)


def test_rmsnorm_and_no_bias_variant() -> None:
    mc = ModelConfig(d_model=32, n_layer=2, n_head=2, norm="rmsnorm", bias=False)
    model = make("rope", mc=mc)
    assert isinstance(model.norm_f, torch.nn.RMSNorm)
    assert all(not n.endswith(".bias") for n, _ in model.named_parameters())
    assert model(torch.randint(0, 48, (1, 8))).shape == (1, 8, 48)


def test_dropout_only_in_training_mode() -> None:
    mc = ModelConfig(d_model=32, n_layer=2, n_head=2, dropout=0.5)
    model = make("alibi", mc=mc)
    idx = torch.randint(0, 48, (2, 16))
    assert not torch.allclose(model(idx), model(idx))
    model.eval()
    torch.testing.assert_close(model(idx), model(idx))


def test_qkv_heads_exposes_hooked_q_and_k() -> None:
    model = make("rope").eval()
    idx = torch.randint(0, 48, (1, 12))
    ctx = model.context(idx)
    attn = model.blocks[0].attn
    x = model.blocks[0].norm1(model.embed(idx, ctx))
    q, k, v = attn.qkv_heads(x, model.scheme, ctx)
    assert q.shape == k.shape == v.shape == (1, 2, 12, 16)
    raw_q = attn.qkv(x)[..., :32].view(1, 12, 2, 16).transpose(1, 2)
    torch.testing.assert_close(q[:, :, 0], raw_q[:, :, 0])  # position 0 is not rotated
    assert not torch.allclose(q[:, :, 1:], raw_q[:, :, 1:])


def test_build_model_uses_run_config() -> None:
    cfg = Config(model=TINY, pos=config_class("learned")(), train=TrainConfig(seq_len=24))
    model = build_model(cfg, vocab_size=30)
    assert model.scheme.max_length == 24 and model.wte.weight.shape == (30, 32)


def test_gpt2_recipe_is_the_default_and_adds_the_sinusoid_times_init_std() -> None:
    assert ModelConfig().embedding == "gpt2"
    model = make("sinusoidal")
    ctx = model.context(torch.zeros(1, 8, dtype=torch.long))
    idx = torch.arange(8)[None] % 48
    pe = model.embed(idx, ctx) - model.wte(idx)  # what the scheme added: 0.02 · PE
    assert model.embed_scale == 1.0
    assert pe.abs().max().item() == pytest.approx(TINY.init_std, rel=1e-4)


@pytest.mark.parametrize("name", sorted(registry()))
def test_fairseq_recipe_scales_tokens_the_same_for_every_scheme(name: str) -> None:
    """fairseq `transformer_lm` (the ALiBi paper's baselines): token table N(0, 1/D), embeddings × √D."""
    mc = ModelConfig(d_model=64, n_layer=n_layer_for(name, 1), n_head=2, embedding="fairseq")
    model = make(name, mc=mc, vocab=512)
    D = mc.d_model
    assert model.embed_scale == pytest.approx(math.sqrt(D))
    assert model.wte.weight.std().item() == pytest.approx(D**-0.5, rel=0.05)
    idx = torch.arange(10)[None]
    ctx = model.context(idx)
    x = model.embed(idx, ctx)  # (1, 10, D)
    assert x.shape == (1, 10, D)
    tokens = model.wte(idx) * math.sqrt(D)  # unit scale
    if "embed" not in model.scheme.hooks:
        torch.testing.assert_close(x, tokens)
    assert tokens.std().item() == pytest.approx(1.0, rel=0.15)
    assert model.lm_head.weight is model.wte.weight  # still tied


def test_fairseq_recipe_adds_the_sinusoid_unscaled_and_learned_tables_at_one_over_sqrt_d() -> None:
    mc = ModelConfig(d_model=64, n_layer=1, n_head=2, embedding="fairseq")
    sin = make("sinusoidal", mc=mc)
    idx = torch.arange(12)[None]
    added = sin.embed(idx, sin.context(idx)) - sin.wte(idx) * 8.0  # √64
    assert added.abs().max().item() == pytest.approx(1.0, abs=1e-3)  # sin/cos at full amplitude
    learned = make("learned", mc=ModelConfig(d_model=256, n_layer=1, n_head=2, embedding="fairseq"), train_length=64)
    assert learned.scheme.wpe.weight.std().item() == pytest.approx(256**-0.5, rel=0.1)


def test_embedding_recipe_is_saved_and_checked() -> None:
    from posenc_cli.config import config_to_dict
    from posenc_cli.errors import ConfigError
    from posenc_cli.run.config_load import config_from_dict

    cfg = config_from_dict({"model": {"embedding": "fairseq"}, "pos": {"name": "sinusoidal"}})
    assert config_to_dict(cfg)["model"]["embedding"] == "fairseq"
    assert config_from_dict(config_to_dict(cfg), saved=True).model.embedding == "fairseq"
    assert config_from_dict({"pos": {"name": "nope"}}, saved=True).model.embedding == "gpt2"  # old runs: gpt2
    with pytest.raises(ConfigError, match=r"model\.embedding"):
        config_from_dict({"model": {"embedding": "t5"}})


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (torch.arange(7), r"position_ids of shape \(7,\) do not fit tokens of shape \(2, 8\)"),
        (torch.zeros(3, 8, dtype=torch.long), r"shape \(3, 8\) do not fit"),
        (torch.zeros(2, 3, 8, dtype=torch.long), r"per-layer position_ids \(2, 3, 8\) need \(B, 2, T\)"),
        (torch.zeros(3, 2, 8, dtype=torch.long), r"shape \(3, 8\) do not fit"),  # per layer, another batch
        (torch.arange(8.0), r"must be integers, got torch.float32"),
        (torch.arange(8) - 1, r"must be >= 0, got -1"),
    ],
)
def test_position_ids_that_do_not_fit_are_refused_at_the_boundary(ids: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make("rope")(torch.zeros(2, 8, dtype=torch.long), position_ids=ids)


def test_explicit_ids_reach_the_context_and_causality_keeps_token_order() -> None:
    model = make("rope").eval()
    idx = torch.zeros(2, 6, dtype=torch.long)
    ids = torch.tensor([[5, 4, 3, 2, 1, 0], [0, 0, 7, 7, 9, 9]], dtype=torch.int32)
    ctx = model.context(idx, ids)
    assert ctx.positions.dtype == torch.long and torch.equal(ctx.positions, ids.long())
    assert torch.equal(ctx.token_index, torch.arange(6)) and ctx.seq_len == 6 and ctx.length == 10
    assert torch.equal(ctx.ids_at(torch.tensor([1, 4])), torch.tensor([[4, 1], [0, 9]]))
    default = model.context(idx)
    assert default.index is None and default.length == 6 and default.token_index is default.positions


@pytest.mark.integration  # compile
@pytest.mark.parametrize("name", ["rope", "alibi", "t5", "irope", "gemma3"])
def test_the_forward_compiles_as_one_graph(name: str) -> None:
    """torch.compile traces the whole forward, the layers' views included, without a graph break
    (`train.compile`: a break splits the model into pieces; a dataclass default of the views once did)."""
    import dataclasses as dc

    import torch._dynamo

    torch._dynamo.reset()
    model = GPT(
        dc.replace(ModelConfig(d_model=32, n_layer=2, n_head=2), n_layer=n_layer_for(name)),
        config_class(name)(),
        48,
        16,
    )
    idx = torch.randint(0, 48, (2, 16))
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    assert torch.equal(compiled(idx), model(idx))
