"""The FlexAttention road: which schemes offer a `score_mod`, the block mask against `Span.visible`, the kernel choice
by `FLEX_MIN_LEN`, PyTorch's missing CPU backward (why `FLEX_GRAD_DEVICES` leaves CPU out), the compiled kernel on
CPU (slow) and gradients through it on CUDA. The equality of every offered `score_mod` with its scheme's `bias`, and of
the road with today's, is in the registry's contract (tests/positional/test_scheme_contract.py)."""

from __future__ import annotations

import pytest
import torch
from attention_utils import LargestAllocation
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from posenc_cli.attention import Flex, KernelSpec, attend, choose, choose_kernel, flex
from posenc_cli.attention.kernels import ChunkedBias, KeyBias, Remapped, Rows, SharedMask
from posenc_cli.attention.windowed import BlockCausal
from posenc_cli.config import ModelConfig
from posenc_cli.positional import PositionalScheme, PositionContext, build_scheme, config_class, registry
from posenc_cli.positional.base import Documents
from posenc_cli.positional.span import FULL, Span

FLEX_BIAS = {"has_bias": True, "bias_shared": True, "offers_score_mod": True, "flex_compiles": True}
KEYED_FLEX = {**FLEX_BIAS, "offers_key_bias": True}
SLIDING, CHUNKED = Span("sliding", 8), Span("chunked", 8)
MODEL = ModelConfig(d_model=32, n_layer=2, n_head=2)


def spec(facts: dict[str, bool], T: int = 64, **kw: object) -> KernelSpec:
    dtype, device = kw.pop("dtype", torch.float32), str(kw.pop("device", "cpu"))
    return KernelSpec(dtype=dtype, device=device, seq_len=T, **facts, **kw)  # type: ignore[arg-type]


def test_the_bias_schemes_that_read_only_positions_offer_score_mod() -> None:
    offered = {n for n, cls in registry().items() if cls.score_mod is not PositionalScheme.score_mod}
    assert offered == {"alibi", "t5", "kerple", "fire", "sandwich"}


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("span", [FULL, SLIDING, CHUNKED], ids=lambda s: s.kind)
def test_mask_mod_hides_what_the_folded_mask_hides(span: Span, causal: bool) -> None:
    T = 29
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    expected = torch.ones(T, T, dtype=torch.bool) if not causal else j <= i
    visible = span.visible(torch.arange(T), torch.arange(T))
    expected = expected if visible is None else expected & visible
    mod = flex.mask_mod(causal, span)
    if mod is None:
        assert expected.all()
        return
    assert torch.equal(mod(torch.tensor(0), torch.tensor(0), i, j).expand(T, T), expected)


def test_block_mask_is_built_once_per_length_span_and_device() -> None:
    assert flex.block_mask(40, True, SLIDING, "cpu") is flex.block_mask(40, True, SLIDING, "cpu")
    assert flex.block_mask(40, True, SLIDING, "cpu") is not flex.block_mask(40, True, CHUNKED, "cpu")
    assert flex.block_mask(40, False, FULL, "cpu") is None


def block_tables(mask: BlockMask) -> list[torch.Tensor | None]:
    return [mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks, mask.full_kv_indices, mask.q_num_blocks,
            mask.q_indices, mask.full_q_num_blocks, mask.full_q_indices]  # fmt: skip


def assert_same_block_mask(got: BlockMask | None, want: BlockMask) -> None:
    assert got is not None and got.seq_lengths == want.seq_lengths and got.BLOCK_SIZE == want.BLOCK_SIZE
    for a, b in zip(block_tables(got), block_tables(want), strict=True):
        assert a is not None and b is not None and torch.equal(a, b)


BLOCK_SPANS = [FULL, SLIDING, Span("sliding", 200), Span("chunked", 64), Span("chunked", 150)]


@pytest.mark.parametrize("T", [1, 128, 300, 513])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("span", BLOCK_SPANS, ids=lambda s: s.describe())
def test_block_mask_equals_pytorchs(T: int, causal: bool, span: Span) -> None:
    """The block tables built from key intervals equal `create_block_mask`'s (which evaluates mask_mod on the T×T
    grid), lengths at, below and beyond a 128-token block, windows shorter and longer than a block."""
    mod = flex.mask_mod(causal, span)
    if mod is None:
        assert flex.block_mask(T, causal, span, "cpu") is None
        return
    assert_same_block_mask(flex.block_mask(T, causal, span, "cpu"), create_block_mask(mod, None, None, T, T, "cpu"))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("span", BLOCK_SPANS, ids=lambda s: s.describe())
def test_document_block_mask_equals_pytorchs(causal: bool, span: Span) -> None:
    """Packed rows: long documents, short ones, and padding (each pad its own document), one block mask per row."""
    T = 300
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randint(0, 3, (T,), generator=g).sort().values, torch.randint(0, 2, (T,), generator=g)])
    ids[0, -7:] = -1
    documents = Documents.from_ids(ids)
    want = create_block_mask(flex.document_mask_mod(documents, causal, span), 2, None, T, T, "cpu")
    assert_same_block_mask(flex.document_block_mask(documents, causal, span), want)


def test_block_masks_never_hold_a_t_by_t_tensor() -> None:
    """At 8,192 tokens no step of building a block mask allocates an eighth of a T×T bool grid (what
    `create_block_mask` evaluates mask_mod on: 8 GiB of intermediates at 32,768 tokens, issue #40)."""
    T = 8192
    ids = torch.arange(T)[None] // 3000  # three documents
    with LargestAllocation() as seen:
        flex.block_mask.__wrapped__(T, True, Span("sliding", 1024), "cpu")  # past the cache
        flex.block_mask.__wrapped__(T, True, FULL, "cpu")
        flex.document_block_mask(Documents.from_ids(ids), True, Span("chunked", 512))
    assert seen.nbytes < T * T // 8, seen.shape


FLEX_CPU = {("cpu", torch.float32): 64, ("cpu", torch.bfloat16): 64}
TABLE: list[tuple[str, KernelSpec, object]] = [
    ("a score_mod from the policy's length", spec(FLEX_BIAS), Flex()),
    ("non-causal", spec(FLEX_BIAS, causal=False), Flex(causal=False)),
    ("sliding window", spec(FLEX_BIAS, span=SLIDING), Flex(span=SLIDING)),
    ("chunks", spec(FLEX_BIAS, span=CHUNKED), Flex(span=CHUNKED)),
    ("shorter than the policy's length", spec(FLEX_BIAS, T=63), SharedMask()),
    ("a gradient on cpu: no backward there", spec(FLEX_BIAS, needs_grad=True), SharedMask()),
    ("dropout", spec(FLEX_BIAS, dropout_p=0.1), SharedMask(dropout_p=0.1)),
    ("forced chunks", spec(FLEX_BIAS, chunk_size=5), ChunkedBias(5)),
    ("KV-cache rows", spec(FLEX_BIAS, q_start=60), Rows(60)),
    ("remapping", spec({**FLEX_BIAS, "remap": True}), Remapped(choose.queries_per_chunk(spec(FLEX_BIAS), 2**25))),
    ("a device the policy does not list", spec(FLEX_BIAS, device="cuda"), SharedMask()),
    ("the key-bias road stays where it applies", spec(KEYED_FLEX), KeyBias()),
    ("a key bias with a window: flex", spec(KEYED_FLEX, span=SLIDING), Flex(span=SLIDING)),
    ("a key bias in bf16: flex", spec(KEYED_FLEX, dtype=torch.bfloat16), Flex()),
    ("a dtype the policy does not list", spec(FLEX_BIAS, dtype=torch.float64), SharedMask()),
    ("no score_mod", spec({"has_bias": True, "bias_shared": True}), SharedMask()),
    ("no compiler for it", spec({**FLEX_BIAS, "flex_compiles": False}), SharedMask()),
    ("no bias, chunks", spec({"has_bias": False}, span=CHUNKED), BlockCausal(8)),
]


@pytest.mark.parametrize(("why", "facts", "expected"), TABLE, ids=[row[0] for row in TABLE])
def test_choose_flex(why: str, facts: KernelSpec, expected: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choose, "FLEX_MIN_LEN", FLEX_CPU)
    assert choose_kernel(facts) == expected, why


def test_gradients_on_cuda_follow_flex_grad_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choose, "FLEX_MIN_LEN", {("cuda", torch.float32): 0})
    assert choose_kernel(spec(FLEX_BIAS, device="cuda", needs_grad=True)) == Flex()
    monkeypatch.setattr(choose, "FLEX_GRAD_DEVICES", ())
    assert choose_kernel(spec(FLEX_BIAS, device="cuda", needs_grad=True)) == SharedMask()


@pytest.mark.parametrize("T", [64, 8192, 32768])
def test_the_default_policy_follows_flex_min_len_on_cpu(T: int) -> None:
    """Flex exactly where `FLEX_MIN_LEN` lists CPU at this length (a full-span key bias keeps its road)."""
    key = ("cpu", torch.float32)
    flex_here = key in choose.FLEX_MIN_LEN and choose.FLEX_MIN_LEN[key] <= T
    for span in (FULL, SLIDING):
        assert isinstance(choose_kernel(spec(FLEX_BIAS, T=T, span=span)), Flex) == flex_here
    assert choose_kernel(spec(KEYED_FLEX, T=T)) == KeyBias()


def test_can_compile_looks_for_inductors_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-posenc")
    flex.can_compile.cache_clear()
    try:
        assert not flex.can_compile("cpu")
    finally:
        flex.can_compile.cache_clear()


def test_pytorch_has_no_flex_backward_on_cpu() -> None:
    """Why `FLEX_GRAD_DEVICES` leaves CPU out; when PyTorch gains it, this fails and the policy can be measured."""
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(1, 1, 16, 8, requires_grad=True)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(q, q, q)


def scheme_and_ctx(name: str, T: int, device: str = "cpu") -> tuple[PositionalScheme, PositionContext]:
    torch.manual_seed(0)
    scheme = build_scheme(config_class(name)(), MODEL, 16).to(device)
    ctx = PositionContext(positions=torch.arange(T, device=device))
    scheme.prepare(ctx)
    return scheme, ctx


@pytest.mark.integration  # compile
@pytest.mark.parametrize(
    ("span", "packed"),
    [(FULL, False), (Span("sliding", 100), False), (Span("chunked", 64), True)],
    ids=["full", "sliding", "chunked-packed"],
)
def test_compiled_flex_on_cpu_equals_todays_road(span: Span, packed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile(flex_attention) (Inductor's CPU template; a minute or more to compile) equals the chunked and
    windowed roads to 1e-5 fp32 at a length that is not a multiple of the 128-token blocks, so the block tables
    (`flex.interval_block_mask`) skip only blocks with nothing visible; packed rows: documents of 90 tokens."""
    scheme, ctx = scheme_and_ctx("t5", 300)
    if packed:
        ctx.documents = Documents.from_ids(torch.arange(300)[None] // 90)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, MODEL.n_head, 300, MODEL.head_dim, generator=g) for _ in range(3))
    ref = attend(q, k, v, scheme, 0, ctx, chunk_size=64, span=span)
    monkeypatch.setattr(choose, "FLEX_MIN_LEN", {("cpu", torch.float32): 0})
    monkeypatch.setattr(flex, "COMPILE", True)
    with torch.no_grad():
        out = attend(q, k, v, scheme, 0, ctx, span=span)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", sorted({"alibi", "t5", "kerple", "fire", "sandwich"}))
@pytest.mark.parametrize("span", [FULL, Span("sliding", 100)], ids=lambda s: s.kind)
def test_flex_gradients_on_cuda_equal_the_reference(name: str, span: Span, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward and the gradients of q, k, v and every scheme parameter through compiled FlexAttention equal the
    chunked/windowed road's to 1e-5 fp32 (relative 1e-4 for the parameters' sums over T² scores)."""
    T = 300

    def run(use_flex: bool) -> list[torch.Tensor]:
        scheme, ctx = scheme_and_ctx(name, T, "cuda")
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (
            torch.randn(2, MODEL.n_head, T, MODEL.head_dim, generator=g, device="cuda", requires_grad=True)
            for _ in range(3)
        )
        with monkeypatch.context() as m:
            m.setattr(choose, "FLEX_MIN_LEN", {("cuda", torch.float32): 0} if use_flex else {})
            out = attend(q, k, v, scheme, 1, ctx, span=span, chunk_size=None if use_flex else 64)
        w = torch.randn(out.shape, generator=g, device="cuda")
        params = [q, k, v, *scheme.parameters()]
        return [out, *torch.autograd.grad((out * w).sum(), params)]

    for got, want in zip(run(True), run(False), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
