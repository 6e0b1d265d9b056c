"""Attention-logit length scaling: `model.attn_scale=logn` (Qwen's use_logn_attn) and `ssmax` (Nakanishi 2025),
log-n as a post-hoc change to a trained run (`extend --logn`), DroPE's β and NoPE HeadScale (the registry
`posenc_cli.temperatures`; its contract: tests/temperatures)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from train_utils import tiny_config, write_corpus

from posenc_cli.attention import logn_factor
from posenc_cli.config import Config, ExtendConfig, ModelConfig, TrainConfig, replace
from posenc_cli.errors import ConfigError, NotExportable
from posenc_cli.extension.extend import extend_run
from posenc_cli.extension.settings import default_out_dir
from posenc_cli.model import GPT, build_model
from posenc_cli.run.export import check_exportable
from posenc_cli.run.load import load_run
from posenc_cli.run.meta import read_meta
from posenc_cli.run.train import train

L = 16


def model(attn_scale: str = "none", pos: str = "rope", seed: int = 0) -> GPT:
    from posenc_cli.positional import config_class

    torch.manual_seed(seed)
    cfg = Config(
        model=ModelConfig(d_model=32, n_layer=2, n_head=2, attn_scale=attn_scale),  # type: ignore[arg-type]
        pos=config_class(pos)(name=pos),
        train=TrainConfig(seq_len=L),
    )
    return build_model(cfg, 64).eval()


def test_logn_factor_is_one_up_to_L_then_log_n_over_log_L() -> None:
    pos = torch.arange(4 * L)
    f = logn_factor(pos, L)
    assert torch.equal(f[:L], torch.ones(L))  # n = 1..L: identity
    n = torch.arange(L + 1, 4 * L + 1, dtype=torch.float64)
    torch.testing.assert_close(f[L:].double(), n.log() / math.log(L), rtol=1e-6, atol=0)


def reference_logits(m: GPT, idx: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """The model's forward with attention written out: softmax(factor_i · q_i·k_j/√hd + causal mask)·v."""
    ctx = m.context(idx)
    x = m.scheme.embed(m.wte(idx), ctx)
    m.scheme.prepare(ctx)
    for block in m.blocks:
        attn = block.attn
        B, T, D = x.shape
        h = block.norm1(x)
        q, k, v = attn.qkv(h).split(D, dim=2)
        q, k, v = (t.view(B, T, attn.n_head, attn.head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = m.scheme.rotate(q, k, ctx)
        scores = q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim) * factor  # (B, H, T, T) * (H or 1, T, 1)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, D)
        x = x + attn.proj(y)
        x = x + block.mlp(block.norm2(x))
    return m.lm_head(m.norm_f(x))


def test_logn_is_the_plain_model_up_to_L_and_the_formula_beyond() -> None:
    plain, logn = model("none"), model("logn")
    logn.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 64, (2, 4 * L), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(logn(idx[:, :L]), plain(idx[:, :L]))  # n <= L: exactly the plain model
        out = logn(idx)
        assert not torch.allclose(out, plain(idx))
        factor = logn_factor(torch.arange(4 * L), L)[:, None]  # (T, 1)
        torch.testing.assert_close(out, reference_logits(logn, idx, factor), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_ssmax_is_s_log_n_per_head(pos: str) -> None:
    m = model("ssmax", pos=pos)
    s = [block.attn.ssmax_scale for block in m.blocks]
    assert all(p.shape == (2,) for p in s)
    torch.testing.assert_close(s[0].detach(), torch.full((2,), 1 / math.log(L)))  # s·log L = 1 at init
    if pos == "rope":
        with torch.no_grad():
            for block in m.blocks:
                block.attn.ssmax_scale.copy_(torch.tensor([0.3, 0.7]))
            idx = torch.randint(0, 64, (2, 2 * L), generator=torch.Generator().manual_seed(1))
            n = torch.arange(1, 2 * L + 1, dtype=torch.float32)
            factor = torch.tensor([0.3, 0.7])[:, None, None] * n.log()[:, None]  # (H, T, 1)
            torch.testing.assert_close(m(idx), reference_logits(m, idx, factor), rtol=1e-4, atol=1e-4)


def test_ssmax_parameters_are_trained_and_saved(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path)
    cfg = tiny_config(corpus, pos="rope", model={"attn_scale": "ssmax"}, steps=3)
    assert cfg.model.logn_length == L  # resolved to the training length, written explicitly
    train(cfg, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.config.model.attn_scale == "ssmax" and run.config.model.logn_length == L
    s = run.model.blocks[0].attn.ssmax_scale
    assert not torch.allclose(s.detach(), torch.full((2,), 1 / math.log(L)))  # moved by training
    with pytest.raises(NotExportable, match="attn_scale=ssmax"):
        check_exportable(run.config)


def test_default_model_has_no_scale_parameters() -> None:
    m = model("none")
    assert not any("ssmax" in name or "head_scale" in name for name, _ in m.named_parameters())
    assert Config().model.logn_length == 0  # unchanged default config


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("logn")
    train(tiny_config(write_corpus(root), pos="rope", steps=4), root / "rope")
    return root / "rope"


def test_extend_logn_on_top_of_a_rope_scaling(parent: Path, tmp_path: Path) -> None:
    ext = ExtendConfig(method="yarn", factor=4, logn=True)
    assert default_out_dir(parent, ext).name == "rope-yarnx4-logn"
    extend_run(parent, tmp_path / "logn", ext)
    extend_run(parent, tmp_path / "yarn", ExtendConfig(method="yarn", factor=4))
    child, plain = load_run(tmp_path / "logn"), load_run(tmp_path / "yarn")
    assert (child.config.model.attn_scale, child.config.model.logn_length) == ("logn", L)
    assert child.config.pos.scaling.method == "yarn"  # type: ignore[attr-defined]
    assert read_meta(tmp_path / "logn")["extend"]["logn"] == {"length": L}
    assert "logn" not in read_meta(tmp_path / "yarn")["extend"]
    idx = torch.randint(0, 256, (1, 3 * L), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(child.model(idx[:, :L]), plain.model(idx[:, :L]))  # the same weights up to L
        assert not torch.allclose(child.model(idx), plain.model(idx))
    with pytest.raises(ConfigError, match="different extension"):  # with and without --logn differ
        extend_run(parent, tmp_path / "logn", ExtendConfig(method="yarn", factor=4))
    with pytest.raises(ConfigError, match="already scales attention logits"):
        extend_run(tmp_path / "logn", tmp_path / "again", ExtendConfig(method="linear", factor=2, logn=True))


def test_bad_model_settings(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="logn_length"):
        replace(ModelConfig(attn_scale="logn"), logn_length=1).validate()


def test_cli_extend_logn(parent: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from posenc_cli.cli import app

    out = tmp_path / "cli"
    result = CliRunner().invoke(app, ["extend", str(parent), "--linear", "--factor", "2", "--logn", "--out", str(out)])
    assert result.exit_code == 0, result.output
    cfg = load_run(out).config
    assert (cfg.model.attn_scale, cfg.model.logn_length, cfg.extend.logn) == ("logn", L, True)
    assert cfg.pos.scaling.method == "linear"  # type: ignore[attr-defined]


def test_drope_is_the_plain_model_up_to_L_then_beta_per_query() -> None:
    """β_i = 1 + c·ln((i + 1)/L) beyond L (DroPE's temperature with s per query, temperature_form=query), written
    out."""
    plain = model("none", pos="nope")
    cfg = replace(plain.config, attn_scale="drope", temperature_c=0.6, logn_length=L, temperature_form="query")
    drope = GPT(cfg, plain.scheme.cfg, 64, L).eval()
    drope.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 64, (2, 4 * L), generator=torch.Generator().manual_seed(0))
    n = torch.arange(1, 4 * L + 1, dtype=torch.float64)
    beta = (1 + 0.6 * (n / L).clamp_min(1).log()).float()[:, None]  # (T, 1)
    with torch.no_grad():
        assert torch.equal(drope(idx[:, :L]), plain(idx[:, :L]))
        torch.testing.assert_close(drope(idx), reference_logits(drope, idx, beta), rtol=1e-4, atol=1e-4)


def test_head_scale_multiplies_every_logit_of_a_head() -> None:
    m = model("head-scale", pos="nope")
    assert [tuple(b.attn.head_scale.shape) for b in m.blocks] == [(2,), (2,)]
    with torch.no_grad():
        idx = torch.randint(0, 64, (2, 2 * L), generator=torch.Generator().manual_seed(1))
        plain = m(idx)
        torch.testing.assert_close(plain, reference_logits(m, idx, torch.ones(1, 1, 1)), rtol=1e-4, atol=1e-4)
        for block in m.blocks:
            block.attn.head_scale.copy_(torch.tensor([1.7, 0.6]))
        factor = torch.tensor([1.7, 0.6])[:, None, None]  # (H, 1, 1), the same at every position
        torch.testing.assert_close(m(idx), reference_logits(m, idx, factor), rtol=1e-4, atol=1e-4)


def test_a_run_saved_before_the_registry_loads() -> None:
    """An ssmax run's config.yaml without `temperature_c` and its weights under `blocks.<i>.attn.ssmax_scale`."""
    from posenc_cli.run.config_load import config_from_dict

    old = {"model": {"d_model": 32, "n_layer": 2, "n_head": 2, "attn_scale": "ssmax", "logn_length": L},
           "pos": {"name": "rope"}, "train": {"seq_len": L}}  # fmt: skip
    cfg = config_from_dict(old)
    assert cfg.model.temperature_c == 0.0
    saved = model("ssmax", seed=3).state_dict()
    assert {k for k in saved if "scale" in k} == {"blocks.0.attn.ssmax_scale", "blocks.1.attn.ssmax_scale"}
    loaded = build_model(cfg, 64).eval()
    loaded.load_state_dict(saved)  # strict: the same keys as before
    assert torch.equal(loaded.blocks[1].attn.ssmax_scale, saved["blocks.1.attn.ssmax_scale"])


def test_bad_temperature_settings() -> None:
    ModelConfig(attn_scale="drope", temperature_c=-0.1).validate()  # any sign: calibrate may fit c < 0
    with pytest.raises(ConfigError, match="needs model.attn_scale=drope"):
        ModelConfig(attn_scale="logn", temperature_c=0.3).validate()
