"""p-RoPE (Barbero et al. 2025): the lowest-frequency 1 − p of RoPE's pairs left unrotated (`pos=rope pos.p=0.75`)."""

from __future__ import annotations

import pytest
import torch

from posenc_cli.config import Config, ModelConfig, TrainConfig
from posenc_cli.errors import ConfigError, NotExportable
from posenc_cli.model import GPT, build_model
from posenc_cli.positional import PositionContext
from posenc_cli.positional.rope import RopeConfig, p_rope_inv_freq, rope_inv_freq
from posenc_cli.rope_scaling import RopeScalingConfig
from posenc_cli.run.export import check_exportable


def model(p: float, seed: int = 0, **rope: object) -> GPT:
    torch.manual_seed(seed)
    cfg = Config(
        model=ModelConfig(d_model=64, n_layer=2, n_head=2),  # head dim 32: 16 pairs
        pos=RopeConfig(p=p, **rope),  # type: ignore[arg-type]
        train=TrainConfig(seq_len=32),
    )
    return build_model(cfg, 64).eval()


def test_p_one_is_rope_exactly() -> None:
    idx = torch.randint(0, 64, (2, 48), generator=torch.Generator().manual_seed(0))
    plain = model(1.0)
    with torch.no_grad():
        assert torch.equal(model(1.0)(idx), plain(idx))
        assert not torch.equal(model(0.75)(idx), plain(idx))  # same weights (seed), other positions
    assert torch.equal(p_rope_inv_freq(rope_inv_freq(32), 1.0), rope_inv_freq(32))


def test_the_unrotated_pairs_are_the_lowest_frequencies() -> None:
    inv = rope_inv_freq(32, 10000.0)  # (16,), decreasing
    out = p_rope_inv_freq(inv, 0.75)
    assert torch.equal(out[:12], inv[:12])  # the 12 highest frequencies keep their values (not re-spaced)
    assert torch.equal(out[12:], torch.zeros(4))  # the lowest 4 (1 − p) do not rotate
    assert float(inv[11:].max()) <= float(inv[:12].min())  # they were the lowest


def test_unrotated_dims_pass_through_and_rotated_ones_turn() -> None:
    """In the model: q's dims of the zero-frequency pairs are unchanged by the rotation at every position."""
    m = model(0.75)
    ctx = PositionContext(positions=torch.arange(40))
    m.scheme.prepare(ctx)
    q = torch.randn(1, 2, 40, 32)
    rq, _ = m.scheme.rotate(q, q, ctx)
    # rotate_half layout: pair k = dims (k, k + 16); pairs 12..15 are dims 12..15 and 28..31
    still = [*range(12, 16), *range(28, 32)]
    assert torch.equal(rq[..., still], q[..., still])
    assert not torch.allclose(rq[..., 1:, :12], q[..., 1:, :12])


def test_p_rope_with_a_scaling_zeroes_after_scaling() -> None:
    scaled = model(0.5, scaling=RopeScalingConfig(method="linear", factor=4.0, original_length=32))
    ctx = PositionContext(positions=torch.arange(8))
    scaled.scheme.prepare(ctx)
    cos = ctx.tables["rope_cos"]  # (T, d) with d = 32: (θ_0..θ_15, θ_0..θ_15)
    angles = torch.arange(8, dtype=torch.float32)[:, None] * (rope_inv_freq(32)[:8] / 4)
    torch.testing.assert_close(cos[:, :8], angles.cos())
    assert torch.equal(cos[:, 8:16], torch.ones(8, 8))


def test_settings_and_export() -> None:
    with pytest.raises(ConfigError, match=r"pos.p must be in \[0, 1\]"):
        RopeConfig(p=1.5).validate()
    cfg = Config(pos=RopeConfig(p=0.75))
    with pytest.raises(NotExportable, match="p-RoPE"):
        check_exportable(cfg)
    assert RopeConfig().p == 1.0


@pytest.mark.parametrize(("p", "head_dim"), [(0.8, 32), (0.75, 32), (0.3, 16), (0.55, 64), (0.99, 8), (0.0, 32)])
def test_the_kept_pairs_are_floored_as_transformers_proportional_type(p: float, head_dim: int) -> None:
    """Oracle: `transformers`' `proportional` rope type (Gemma-style p-RoPE) keeps int(p·hd // 2) pairs."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim)
    config.rope_parameters = {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": p}
    hf, _ = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu")
    ours = p_rope_inv_freq(rope_inv_freq(head_dim), p)
    assert int((ours > 0).sum()) == int((hf > 0).sum())
    torch.testing.assert_close(ours, hf.float(), rtol=1e-6, atol=0)
