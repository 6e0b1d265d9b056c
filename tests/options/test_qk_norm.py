"""QK-norm (posenc_cli/options/qk_norm.py): RMS with weights before the rotation, weightless L2 after it, on every
layer or only where the layer's scheme rotates, and before any temperature."""

from __future__ import annotations

import dataclasses

import torch
from test_contract_options import TINY, VOCAB, tokens

from posenc_cli.model import GPT
from posenc_cli.options.qk_norm import rms_normalised
from posenc_cli.positional import config_class
from posenc_cli.positional.layout import LayoutConfig


def test_rms_normalised_gives_each_head_norm_sqrt_hd() -> None:
    x = torch.randn(2, 5, 3, 8) * 7
    torch.testing.assert_close(rms_normalised(x).norm(dim=-1), torch.full((2, 5, 3), 8**0.5), atol=1e-4, rtol=0)
    assert rms_normalised(x.bfloat16()).dtype == torch.bfloat16


def test_rotary_only_normalises_a_layouts_rope_layers_and_gives_the_others_no_weight() -> None:
    pos = LayoutConfig(layers=[{"name": "rope"}, {"name": "nope"}])
    for kind in ("rms", "l2"):
        cfg = dataclasses.replace(TINY, qk_norm=kind, qk_norm_layers="rotary")
        m = GPT(cfg, pos, VOCAB, 16)
        assert [b.options["qk_norm"].kind for b in m.blocks] == [kind, "none"]
        every = GPT(dataclasses.replace(cfg, qk_norm_layers="all"), pos, VOCAB, 16)
        assert [b.options["qk_norm"].kind for b in every.blocks] == [kind, kind]
    keys = [k for k in GPT(dataclasses.replace(TINY, qk_norm="rms", qk_norm_layers="rotary"), pos, VOCAB, 16)
            .state_dict() if "options" in k]  # fmt: skip
    assert keys == ["blocks.0.options.qk_norm.q_weight", "blocks.0.options.qk_norm.k_weight"]


def test_the_norm_runs_before_the_temperature() -> None:
    """l2 after the rotation, then the length scale: q's rows keep SSMax's factor s·log n on top of √hd."""
    cfg = dataclasses.replace(TINY, qk_norm="l2", attn_scale="ssmax")
    torch.manual_seed(0)
    m = GPT(cfg, config_class("rope")(), VOCAB, 16).eval()
    block, idx = m.blocks[0], tokens(1, 12)
    with torch.no_grad():
        ctx = m.context(idx)
        q, k, _ = block.attn.qkv_heads(block.norm1(m.wte(idx)), m.scheme, ctx, options=block.options)
    hd = cfg.head_dim
    torch.testing.assert_close(k.norm(dim=-1), torch.full(k.shape[:3], hd**0.5), atol=0, rtol=1e-3)  # ε
    n = torch.arange(1, 13).float()  # keys each query sees
    expected = hd**0.5 * block.attn.ssmax_scale.view(1, -1, 1) * n.log().view(1, 1, -1)  # (1, H, T)
    torch.testing.assert_close(q.norm(dim=-1), expected.expand_as(q.norm(dim=-1)), atol=0, rtol=1e-3)
