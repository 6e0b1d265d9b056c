"""The kernel choice: a table of facts -> kernel for `choose_kernel`, what `describe` reads from a scheme and q, and
that a forward chooses once for all its layers."""

from __future__ import annotations

import pytest
import torch

from posenc_cli.attention import AttentionState, KernelSpec, choose_kernel, describe
from posenc_cli.attention.choose import FP32_GRAD_MAX_LEN, bias_chunk_size
from posenc_cli.attention.kernels import (
    ChunkedBias,
    Fused,
    InFp32,
    Kernel,
    KeyBias,
    LastRow,
    Remapped,
    Rows,
    SharedMask,
)
from posenc_cli.config import ModelConfig, PosConfig, RemapConfig
from posenc_cli.model import GPT
from posenc_cli.positional import PositionalScheme, PositionContext, config_class
from posenc_cli.positional.rope import RopeConfig

F32, BF16, F64 = torch.float32, torch.bfloat16, torch.float64
# Scheme facts: no bias (NoPE, RoPE); a shared bias offered as key_bias (ALiBi); a per-layer bias (CoPE, FIRE).
PLAIN = {"has_bias": False}
KEYED = {"has_bias": True, "bias_shared": True, "offers_key_bias": True}
SHARED = {"has_bias": True, "bias_shared": True}
PER_LAYER = {"has_bias": True}
LONG = 10**6  # so long that one chunk of the bias path holds fewer queries than T
LONG_CHUNK = bias_chunk_size(1, 1, LONG)
REMAP_CHUNK = bias_chunk_size(1, 1, 64, 32 * 2**20)
REMAPS = {"has_bias": False, "remap": True}


def spec(facts: dict[str, bool], dtype: torch.dtype = F32, T: int = 64, **kw: object) -> KernelSpec:
    return KernelSpec(dtype=dtype, device=str(kw.pop("device", "cpu")), seq_len=T, **facts, **kw)  # type: ignore[arg-type]


TABLE: list[tuple[str, KernelSpec, Kernel]] = [
    ("no bias: fused causal", spec(PLAIN), Fused()),
    ("no bias, non-causal", spec(PLAIN, causal=False), Fused(causal=False)),
    ("no bias, dropout", spec(PLAIN, dropout_p=0.1), Fused(dropout_p=0.1)),
    ("no bias, bf16 training: fp32 inside", spec(PLAIN, BF16, needs_grad=True), InFp32(Fused())),
    ("no bias, bf16 training past the limit", spec(PLAIN, BF16, FP32_GRAD_MAX_LEN + 1, needs_grad=True), Fused()),
    ("no bias, bf16 training on cuda", spec(PLAIN, BF16, needs_grad=True, device="cuda"), Fused()),
    ("no bias, fp32 training", spec(PLAIN, needs_grad=True), Fused()),
    ("key bias, fp32 cpu", spec(KEYED), KeyBias()),
    ("key bias, fp64 cpu", spec(KEYED, F64), KeyBias()),
    ("key bias, bf16: shared mask", spec(KEYED, BF16), SharedMask()),
    ("key bias, bf16 training: fp32 key bias", spec(KEYED, BF16, needs_grad=True), InFp32(KeyBias())),
    ("key bias, cuda fp32: shared mask", spec(KEYED, device="cuda"), SharedMask()),
    ("key bias, non-causal", spec(KEYED, causal=False), SharedMask(causal=False)),
    ("key bias, forced chunks", spec(KEYED, chunk_size=5), ChunkedBias(5)),
    ("key bias, forced single chunk", spec(KEYED, chunk_size=64), SharedMask()),
    ("shared bias, bf16 long: chunks", spec(KEYED, BF16, LONG), ChunkedBias(LONG_CHUNK)),
    ("shared bias, no key bias", spec(SHARED), SharedMask()),
    ("per-layer bias: chunked, one chunk", spec(PER_LAYER), ChunkedBias(bias_chunk_size(1, 1, 64))),
    ("per-layer bias, forced chunks, dropout", spec(PER_LAYER, chunk_size=3, dropout_p=0.5), ChunkedBias(3, True, 0.5)),
    ("cache, one new row, no bias", spec(PLAIN, T=11, q_start=10), LastRow(10)),
    ("cache, two new rows, no bias", spec(PLAIN, T=12, q_start=10), Rows(10)),
    ("cache, one new row, bias", spec(KEYED, T=11, q_start=10), Rows(10)),
    ("cache, bf16", spec(PER_LAYER, BF16, T=11, q_start=10), Rows(10)),
    ("remap", spec(REMAPS), Remapped(REMAP_CHUNK)),
    ("remap, cache rows", spec(REMAPS, q_start=60), Remapped(REMAP_CHUNK, q_start=60)),
    ("remap, forced chunks", spec({"has_bias": True, "remap": True}, chunk_size=7), Remapped(7)),
    ("remap, bf16 training", spec(REMAPS, BF16, needs_grad=True), InFp32(Remapped(REMAP_CHUNK))),
]


@pytest.mark.parametrize(("facts", "expected"), [(s, k) for _, s, k in TABLE], ids=[n for n, _, _ in TABLE])
def test_choose_kernel_table(facts: KernelSpec, expected: Kernel) -> None:
    assert choose_kernel(facts) == expected


def test_describe_reads_the_scheme_and_q() -> None:
    model = GPT(ModelConfig(d_model=32, n_layer=1, n_head=4), config_class("alibi")(), 48, 16)
    ctx = PositionContext(positions=torch.arange(12))
    model.scheme.prepare(ctx)
    q = torch.zeros(3, 4, 12, 8, requires_grad=True)
    got = describe(AttentionState(model.scheme, ctx), q, chunk_size=4, dropout_p=0.2)
    assert got == KernelSpec(
        has_bias=True,
        dtype=F32,
        device="cpu",
        seq_len=12,
        batch=3,
        n_head=4,
        needs_grad=True,
        bias_shared=True,
        offers_key_bias=True,
        offers_score_mod=True,
        flex_compiles=False,  # T = 13 is below FLEX_MIN_LEN: the compiler is not even looked for
        chunk_size=4,
        dropout_p=0.2,
    )


@pytest.mark.parametrize(("ids", "remaps"), [(None, True), (torch.arange(12) // 4, False), (torch.arange(12), True)])
def test_describe_remaps_only_where_ids_reach_the_window(ids: torch.Tensor | None, remaps: bool) -> None:
    pos = RopeConfig(remap=RemapConfig(method="rerope", window=5))
    model = GPT(ModelConfig(d_model=32, n_layer=1, n_head=2), pos, 48, 16)
    ctx = model.context(torch.zeros(1, 12, dtype=torch.long), ids)
    spec_ = describe(AttentionState(model.scheme, ctx), torch.zeros(1, 2, 12, 16))
    assert spec_.remap is remaps and not spec_.has_bias and not spec_.offers_key_bias


def test_a_forward_chooses_once_for_all_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    import posenc_cli.attention.choose as choose

    chosen: list[KernelSpec] = []
    real = choose.choose_kernel

    def spy(facts: KernelSpec) -> Kernel:
        chosen.append(facts)
        return real(facts)

    monkeypatch.setattr(choose, "choose_kernel", spy)
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=32, n_layer=3, n_head=2), config_class("alibi")(), 48, 16).eval()
    with torch.no_grad():
        model(torch.randint(0, 48, (2, 10)))
        assert len(chosen) == 1 and chosen[0].offers_key_bias
        cache = model.new_cache()
        model(torch.randint(0, 48, (1, 6)), cache=cache)  # prefill: the full forward's kernel
        model(torch.randint(0, 48, (1, 1)), cache=cache)  # one step: the rows kernel, chosen once for 3 layers
    assert len(chosen) == 3 and chosen[-1].q_start == 6


def test_a_state_refuses_another_forward() -> None:
    model = GPT(ModelConfig(d_model=32, n_layer=1, n_head=2), config_class("nope")(), 48, 16)
    idx = torch.zeros(1, 4, dtype=torch.long)
    ctx, other = model.context(idx), model.context(idx)
    x = model.embed(idx, ctx)
    with pytest.raises(ValueError, match="another scheme or forward"):
        model.blocks[0].attn(x, model.scheme, ctx, state=AttentionState(model.scheme, other))


def test_the_default_rotate_rows_rotates_the_padded_queries() -> None:
    """A scheme that overrides only `rotate` (here one that reads every query row) gets its rows from the full
    rotation of zero-padded queries."""

    class Cumulative(PositionalScheme):
        name = "cumulative-test"
        hooks = ("rotate",)

        def rotate(self, q: torch.Tensor, k: torch.Tensor, ctx: PositionContext) -> tuple[torch.Tensor, torch.Tensor]:
            return q.cumsum(dim=2) + ctx.positions[:, None], k * 2  # row i depends on rows 0..i

    scheme = Cumulative(PosConfig(name="cumulative-test"), ModelConfig(d_model=32, n_head=2), 16)
    ctx = PositionContext(positions=torch.arange(6))
    q, k = torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    padded = torch.cat([torch.zeros(1, 2, 4, 16), q[:, :, 4:]], dim=2)
    rows, keys = scheme.rotate_rows(q[:, :, 4:], k, ctx, 4)
    assert torch.equal(rows, scheme.rotate(padded, k, ctx)[0][:, :, 4:]) and torch.equal(keys, k * 2)
