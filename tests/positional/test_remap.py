"""Self-Extend and ReRoPE (pos.remap): against a per-pair implementation of the papers' formulas, plain RoPE within
the window, chunking, per-row ids, validation and the config round trip."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from attention_utils import attention_weights, force_chunks, layer_qkv

from posenc_cli.attention import CausalSelfAttention, attend
from posenc_cli.config import Config, ModelConfig, RemapConfig, config_to_dict, config_to_yaml
from posenc_cli.errors import ConfigError
from posenc_cli.model import GPT
from posenc_cli.positional import PositionContext
from posenc_cli.positional.remap import remapped_distance, remapped_positions
from posenc_cli.positional.rope import RoPE, RopeConfig
from posenc_cli.run.config_load import config_from_dict

METHODS = [
    RemapConfig(method="self-extend", window=6, group=3),
    RemapConfig(method="self-extend", window=5, group=4),
    RemapConfig(method="rerope", window=7),
    RemapConfig(method="rerope", window=6, leaky=4.0),
]


def rotate_by(x: torch.Tensor, r: float, base: float = 10000.0) -> torch.Tensor:
    """float64 rotate_half RoPE of vector x (d,) by the relative position r."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    c, s = torch.cos(r * theta), torch.sin(r * theta)
    x1, x2 = x[: d // 2], x[d // 2 :]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c])


def direct_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: RemapConfig) -> torch.Tensor:
    """The papers' formula with explicit loops over (head, i, j ≤ i), float64: score = ⟨R(r(i, j))·q_i, k_j⟩/√hd
    with r the remapped relative position (`remapped_distance`), softmax over j, times v. q, k, v (H, T, hd)."""
    H, T, hd = q.shape
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros(H, T, hd, dtype=torch.float64)
    for h in range(H):
        for i in range(T):
            r = [remapped_distance(cfg, i, j) for j in range(i + 1)]
            scores = torch.stack([rotate_by(q[h, i], r[j]) @ k[h, j] for j in range(i + 1)]) / math.sqrt(hd)
            out[h, i] = torch.softmax(scores, dim=0) @ v[h, : i + 1]
    return out


def scheme_for(remap: RemapConfig, head_dim: int = 8, n_head: int = 2) -> RoPE:
    model = ModelConfig(d_model=head_dim * n_head, n_head=n_head, n_layer=1)
    return RoPE(RopeConfig(remap=remap), model, train_length=16)


@pytest.mark.parametrize("cfg", METHODS, ids=lambda c: c.describe())
@pytest.mark.parametrize("chunk", [None, 5])
def test_equals_the_direct_formula(cfg: RemapConfig, chunk: int | None) -> None:
    torch.manual_seed(0)
    H, T, hd = 2, 23, 8
    q, k, v = (torch.randn(1, H, T, hd) for _ in range(3))
    scheme = scheme_for(cfg, hd, H)
    ctx = PositionContext(positions=torch.arange(T))
    scheme.prepare(ctx)
    qr, kr = scheme.rotate(q, k, ctx)
    out = attend(qr, kr, v, scheme, 0, ctx, chunk_size=chunk)[0]  # (H, T, hd)
    torch.testing.assert_close(out.double(), direct_attention(q[0], k[0], v[0], cfg), atol=1e-5, rtol=0)


@pytest.mark.parametrize("cfg", METHODS, ids=lambda c: c.describe())
def test_log_n_scales_the_query_of_both_scores(cfg: RemapConfig) -> None:
    """bojone/rerope `rerope_patch.py:56`: the query is multiplied by max(1, log(i + 1) / log L) before either
    rotation, so the windowed and the rectified score both carry it; posenc's `model.attn_scale=logn` likewise."""
    torch.manual_seed(2)
    H, T, hd, L = 2, 23, 8, 8
    model = ModelConfig(d_model=H * hd, n_head=H, n_layer=1, attn_scale="logn", logn_length=L)
    attn = CausalSelfAttention(model, 0).eval()
    scheme = RoPE(RopeConfig(remap=cfg), model, train_length=L)
    x = torch.randn(1, T, H * hd)
    ctx = PositionContext(positions=torch.arange(T))
    scheme.prepare(ctx)
    with torch.no_grad():
        out = attend(*attn.qkv_heads(x, scheme, ctx), scheme, 0, ctx)[0]  # (H, T, hd)
        q, k, v = (t.view(T, H, hd).transpose(0, 1) for t in attn.qkv(x)[0].split(H * hd, dim=-1))  # (H, T, hd)
    factor = (torch.arange(1, T + 1, dtype=torch.float64).log() / math.log(L)).clamp(min=1.0)  # (T,)
    expected = direct_attention(q.double() * factor[:, None], k, v, cfg)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)


def test_remapped_distance_is_the_papers() -> None:
    se = RemapConfig(method="self-extend", window=4, group=2)
    assert [remapped_distance(se, 9, j) for j in (9, 6, 5, 4, 0)] == [0, 3, 4, 4, 6]  # 4 + 4 - 2 - ⌊j/2⌋
    # G ∤ W: LongLM's corrected formula (715c1e3, Llama_4_40.py:131) floors W/G: ⌊20/4⌋ + 5 − ⌊5/4⌋ − ⌊j/4⌋, not 8.75
    odd = RemapConfig(method="self-extend", window=5, group=4)
    assert [remapped_distance(odd, 20, j) for j in (16, 15, 8, 0)] == [4, 6, 7, 9]
    q, k = remapped_positions(odd, torch.tensor([20, 0]))
    assert (q[0] - k[1]).item() == 9.0
    rr = RemapConfig(method="rerope", window=4)
    assert [remapped_distance(rr, 20, j) for j in (20, 17, 16, 0)] == [0, 3, 4, 4]
    leaky = RemapConfig(method="rerope", window=4, leaky=8.0)
    assert remapped_distance(leaky, 20, 0) == 4 + 16 / 8


def tiny_models(remap: RemapConfig) -> tuple[GPT, GPT]:
    torch.manual_seed(1)
    model = ModelConfig(d_model=32, n_head=2, n_layer=2)
    plain = GPT(model, RopeConfig(), vocab_size=50, train_length=16).eval()
    remapped = GPT(model, RopeConfig(remap=remap), vocab_size=50, train_length=16).eval()
    remapped.load_state_dict(plain.state_dict())
    return plain, remapped


@pytest.mark.parametrize("cfg", METHODS, ids=lambda c: c.describe())
def test_within_the_window_it_is_plain_rope_exactly(cfg: RemapConfig) -> None:
    plain, remapped = tiny_models(cfg)
    idx = torch.randint(0, 50, (2, cfg.window))
    with torch.no_grad():
        assert torch.equal(plain(idx), remapped(idx))
        ids = torch.arange(cfg.window) + 100  # shifted ids spanning fewer than W positions: plain road too
        assert torch.equal(plain(idx, position_ids=ids), remapped(idx, position_ids=ids))


@pytest.mark.parametrize("cfg", METHODS, ids=lambda c: c.describe())
def test_model_beyond_the_window_chunked_and_per_row_ids(cfg: RemapConfig) -> None:
    plain, remapped = tiny_models(cfg)
    idx = torch.randint(0, 50, (2, 40))
    with torch.no_grad():
        whole = remapped(idx)
        assert (whole - plain(idx)).abs().max() > 1e-5  # the remapping changes the logits (random init: a little)
        force_chunks(remapped, 7)
        torch.testing.assert_close(remapped(idx), whole, atol=1e-5, rtol=0)
        # (B, T) ids, the same for both rows, give what (T,) ids give; a row shifted by a constant is unchanged
        ids = torch.arange(40)
        torch.testing.assert_close(remapped(idx, position_ids=ids[None].expand(2, 40)), whole, atol=1e-5, rtol=0)
        if cfg.method == "rerope" and not cfg.leaky:  # min(i − j, W) only sees differences
            torch.testing.assert_close(remapped(idx, position_ids=ids + 13), whole, atol=1e-4, rtol=0)


def test_viz_attention_uses_the_remapping() -> None:

    cfg = METHODS[0]
    _, model = tiny_models(cfg)
    idx = torch.randint(0, 50, (1, 30))
    with torch.no_grad():
        for (layer, q, k, v, ctx), block in zip(layer_qkv(model, idx), model.blocks, strict=True):
            w = attention_weights(q, k, model.scheme, layer, ctx, chunk=4)  # (B, H, T, T)
            expected = attend(q, k, v, model.scheme, layer, ctx)
            torch.testing.assert_close(w @ v, expected, atol=1e-5, rtol=0)
            assert block is model.blocks[layer]


@pytest.mark.parametrize(
    ("remap", "message"),
    [
        (RemapConfig(method="nosuch", window=4), "unknown pos.remap.method"),
        (RemapConfig(method="self-extend", window=0, group=2), "window >= 1"),
        (RemapConfig(method="self-extend", window=8, group=0), "group size >= 1"),
        (RemapConfig(method="rerope", window=8, leaky=1.0), "leaky k must be > 1"),
        (RemapConfig(method="rerope", window=8, group=2), "group belongs to self-extend"),
        (RemapConfig(method="self-extend", window=8, group=2, leaky=3.0), "leaky belongs to rerope"),
    ],
)
def test_bad_settings_are_refused(remap: RemapConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RopeConfig(remap=remap).validate()


def test_config_round_trip() -> None:
    cfg = Config(pos=RopeConfig(remap=RemapConfig(method="rerope", window=64, leaky=16.0)))
    back = config_from_dict(yaml.safe_load(config_to_yaml(cfg)), saved=True)
    assert back.pos.remap == RemapConfig(method="rerope", window=64, leaky=16.0)  # type: ignore[attr-defined]
    assert config_to_dict(back) == config_to_dict(cfg)
    old = yaml.safe_load(config_to_yaml(Config(pos=RopeConfig())))
    del old["pos"]["remap"]  # a config.yaml written before pos.remap existed loads as plain RoPE
    assert config_from_dict(old, saved=True).pos.remap == RemapConfig()  # type: ignore[attr-defined]


def test_scores_are_built_chunk_by_chunk_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc_cli.attention import choose, kernels

    B, H, T, hd = 2, 2, 40, 8
    shapes = []
    merged = kernels.merged_scores

    def spy(*args: object) -> torch.Tensor:
        out = merged(*args)  # type: ignore[arg-type]
        shapes.append(tuple(out.shape))
        return out

    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, hd) for _ in range(3))
    scheme = scheme_for(METHODS[0], hd, H)
    ctx = PositionContext(positions=torch.arange(T))
    scheme.prepare(ctx)
    whole = attend(q, k, v, scheme, 0, ctx)
    monkeypatch.setattr(kernels, "merged_scores", spy)
    monkeypatch.setattr(choose, "BIAS_CHUNK_BYTES", 2 * 4 * B * H * T * 6)  # two fp32 (B, H, 6, T) tensors
    torch.testing.assert_close(attend(q, k, v, scheme, 0, ctx), whole, atol=1e-6, rtol=0)
    assert len(shapes) == 7 and max(s[2] for s in shapes) == 6  # ceil(40 / 6) chunks of at most 6 queries
    assert [s[3] for s in shapes] == [6, 12, 18, 24, 30, 36, 40]  # causal: chunk [s, e) sees keys [0, e)
