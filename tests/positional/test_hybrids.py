"""The 2025-26 presets of posenc_cli/positional/hybrids.py: GPT-OSS (sliding and full 1:1, θ 150,000, learned
sinks switched on) and Gemma 4 (5:1, proportional RoPE on the globals, as transformers' `proportional` rope type)."""

from __future__ import annotations

import dataclasses

import torch

from posenc_cli.config import Config
from posenc_cli.model import build_model
from posenc_cli.positional.rope import p_rope_inv_freq
from posenc_cli.run.config_load import config_from_dict

VOCAB = 48


def resolved(name: str, n_layer: int, seq_len: int = 32, **pos: object) -> Config:
    return config_from_dict(
        {"pos": {"name": name, **pos}, "model": {"n_layer": n_layer}, "train": {"seq_len": seq_len}}
    )


def test_gpt_oss_alternates_sliding_and_full_rope_layers_with_sinks() -> None:
    cfg = resolved("gpt-oss", 4)
    assert cfg.model.attn_sinks  # recorded in the run's model config
    model = build_model(cfg, VOCAB)
    assert model.scheme.describe_layers() == ["rope, sliding 8", "rope"] * 2  # even layers slide; W = L/4
    assert [model.scheme.schemes[j].cfg.base for j in model.scheme.scheme_of_layer] == [150_000.0] * 4
    assert all(block.options["attn_sinks"].sinks.shape == (cfg.model.n_head,) for block in model.blocks)
    assert not resolved("gpt-oss", 2, sinks=False).model.attn_sinks  # the layout alone
    again = config_from_dict(dataclasses.asdict(cfg), saved=True)
    assert again.model == cfg.model and again.pos == cfg.pos


def test_gemma4_globals_rotate_the_proportional_pairs() -> None:
    """transformers' `proportional` rope: n = int(p·d // 2) pairs of θ_k = base^(−2k/d) over the whole head, the
    rest frequency 0 (modeling_rope_utils.py); p 0.25, θ 10⁶ on every 6th layer, sliding θ 10⁴ elsewhere."""
    model = build_model(resolved("gemma4", 6), VOCAB)
    scheme = model.scheme
    assert scheme.describe_layers() == ["rope, sliding 8"] * 5 + ["rope"]
    hd = model.config.head_dim
    glob = scheme.schemes[scheme.scheme_of_layer[5]]
    inv_freq, factor = glob.frequencies(32)
    inv_freq = p_rope_inv_freq(inv_freq, glob.cfg.p)  # as `prepare` applies pos.p
    n = int(0.25 * hd // 2)
    expected = torch.cat([1e6 ** (-2 * torch.arange(n, dtype=torch.float64) / hd), torch.zeros(hd // 2 - n)])
    torch.testing.assert_close(inv_freq.double(), expected, atol=1e-12, rtol=1e-6)
    assert factor == 1.0 and glob.cfg.base == 1e6
    local = scheme.schemes[scheme.scheme_of_layer[0]]
    assert local.cfg.base == 1e4 and bool((local.frequencies(32)[0] > 0).all())
