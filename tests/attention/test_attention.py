"""Attention: the chunked bias path equals the unchunked one and a naive softmax reference; memory stays bounded."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch
from attention_utils import force_chunks
from torch import Tensor

from posenc_cli.attention import attend, bias_chunk_size, fold_causal_mask
from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.model import GPT
from posenc_cli.positional import PositionalScheme, PositionContext
from posenc_cli.positional.alibi import AlibiConfig, alibi_slopes
from posenc_cli.positional.nope import NoPE, NopeConfig


class TableBias(PositionalScheme):
    """Test-only (unregistered) scheme: an arbitrary learned (H, Tmax, Tmax) bias indexed by positions."""

    name = "table-bias-test"
    hooks = ("bias",)

    def __init__(self, model: ModelConfig, t_max: int) -> None:
        super().__init__(PosConfig(name=self.name), model, t_max)
        self.table = torch.nn.Parameter(torch.randn(model.n_head, t_max, t_max))

    def bias(self, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, ctx: PositionContext) -> Tensor:
        return self.table[:, q_pos][:, :, k_pos]  # (H, Tq, Tk)


def naive_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, causal: bool = True) -> Tensor:
    """softmax(q·kᵀ/√d + bias + causal mask)·v, in float64, written out."""
    q, k, v, bias = q.double(), k.double(), v.double(), bias.double()
    T = q.shape[-2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def qkv(B: int = 2, H: int = 4, T: int = 23, d: int = 8, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, d, generator=g) for _ in range(3))  # type: ignore[return-value]


@pytest.mark.parametrize("chunk", [1, 3, 7, 22, 23, None])
@pytest.mark.parametrize("causal", [True, False])
def test_chunked_bias_equals_naive_reference(chunk: int | None, causal: bool) -> None:
    torch.manual_seed(0)
    mc = ModelConfig(d_model=32, n_head=4)
    scheme = TableBias(mc, 23)
    q, k, v = qkv()
    ctx = PositionContext(positions=torch.arange(23))
    with torch.no_grad():
        out = attend(q, k, v, scheme, 0, ctx, causal=causal, chunk_size=chunk)
        ref = naive_attention(q, k, v, scheme.table, causal)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_alibi_attention_equals_naive_with_explicit_bias() -> None:
    from posenc_cli.positional.alibi import ALiBi

    H, T = 6, 31
    scheme = ALiBi(AlibiConfig(), ModelConfig(d_model=48, n_head=H), 16)
    q, k, v = qkv(H=H, T=T)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    bias = -alibi_slopes(H)[:, None, None] * (i - j)  # written from the paper: −m·(i − j)
    ctx = PositionContext(positions=torch.arange(T))
    scheme.prepare(ctx)
    for chunk in (4, None):
        out = attend(q, k, v, scheme, 0, ctx, chunk_size=chunk)
        torch.testing.assert_close(out.double(), naive_attention(q, k, v, bias), rtol=1e-5, atol=1e-5)


def test_chunked_gradients_equal_unchunked() -> None:
    torch.manual_seed(0)
    scheme = TableBias(ModelConfig(d_model=32, n_head=4), 23)
    ctx = PositionContext(positions=torch.arange(23))
    grads = []
    for chunk in (5, None):
        q, k, v = (t.requires_grad_() for t in qkv())
        scheme.zero_grad()
        attend(q, k, v, scheme, 0, ctx, chunk_size=chunk).square().sum().backward()
        grads.append([q.grad, k.grad, v.grad, scheme.table.grad.clone()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_no_bias_path_equals_naive() -> None:
    scheme = NoPE(NopeConfig(), ModelConfig(d_model=32, n_head=4), 16)
    q, k, v = qkv()
    ctx = PositionContext(positions=torch.arange(23))
    zero = torch.zeros(23, 23)
    for causal in (True, False):
        out = attend(q, k, v, scheme, 0, ctx, causal=causal)
        torch.testing.assert_close(out.double(), naive_attention(q, k, v, zero, causal), rtol=1e-5, atol=1e-5)


def test_model_chunked_equals_unchunked() -> None:
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=32, n_layer=2, n_head=4), AlibiConfig(), 64, 16).eval()
    idx = torch.randint(0, 64, (2, 40))
    full = model(idx)
    force_chunks(model, 3)
    torch.testing.assert_close(model(idx), full, rtol=1e-5, atol=1e-5)


def test_fold_causal_mask_dtype_and_values() -> None:
    pos = torch.arange(4)
    mask = fold_causal_mask(torch.ones(2, 4, 4), pos, pos, torch.bfloat16, causal=True)
    assert mask.dtype == torch.bfloat16 and mask.shape == (1, 2, 4, 4)
    assert torch.isinf(mask[0, 0]).equal(torch.ones(4, 4, dtype=torch.bool).triu(1))
    # A chunk of queries 2..3 against keys 0..3: only key 3 is in the future of query 2.
    mask = fold_causal_mask(None, pos[2:], pos, torch.float32, causal=True)
    assert torch.isinf(mask[0, 0]).tolist() == [[False, False, False, True], [False, False, False, False]]


def test_bias_under_bf16_autocast_matches_q_dtype() -> None:
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=32, n_layer=2, n_head=4), AlibiConfig(), 64, 16)
    idx = torch.randint(0, 64, (2, 40))
    ref = model(idx)
    force_chunks(model, 7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(idx)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() < 0.05 * ref.abs().max() + 0.02


def test_chunk_size_budget() -> None:
    assert bias_chunk_size(1, 8, 8192, budget=64 * 2**20) == 256  # 256·8192·8·4 bytes = 64 MiB
    assert bias_chunk_size(1, 8, 128) >= 128  # short sequences: one chunk
    assert bias_chunk_size(64, 64, 10**6, budget=1) == 1


PEAK_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    torch.set_num_threads(1)
    from posenc_cli.config import ModelConfig
    from posenc_cli.model import GPT
    from posenc_cli.positional.alibi import AlibiConfig

    def peak_mib():  # VmHWM: this address space's peak (ru_maxrss would inherit the parent's size across exec)
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024

    T = int(sys.argv[1])
    model = GPT(ModelConfig(d_model=64, n_layer=1, n_head=8), AlibiConfig(), 64, 128).eval()
    idx = torch.randint(0, 64, (1, T))
    with torch.inference_mode():
        model(idx[:, :64])  # warm up allocator and kernels
        before = peak_mib()
        model(idx)
        after = peak_mib()
    print(before, after - before)
    """
)


@pytest.mark.integration  # a subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmHWM from /proc/self/status")
def test_long_alibi_forward_stays_memory_bounded() -> None:
    """T = 4096, H = 8: a full fp32 (H, T, T) bias alone is 512 MiB; the chunked path must stay far below that."""
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, "4096"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    before_mib, growth_mib = map(float, out.stdout.split()[-2:])
    assert before_mib < 1024  # the child's own peak, not inherited from pytest
    assert growth_mib < 350, f"peak RSS grew by {growth_mib:.0f} MiB"


# ----------------------------------------------------------------------------------------------------------------
# The key-bias road: a bias b_h(j) + c_h(i) added through SDPA's fused causal kernel.


class KeyPlusRowBias(PositionalScheme):
    """Test-only scheme: learned bias[h, i, j] = b[h, j] + c[h, i]; `key_bias` offers b alone."""

    name = "key-plus-row-test"
    hooks = ("bias",)
    bias_shared_across_layers = True

    def __init__(self, model: ModelConfig, t_max: int, offer_key_bias: bool = True) -> None:
        super().__init__(PosConfig(name=self.name), model, t_max)
        self.b = torch.nn.Parameter(torch.randn(model.n_head, t_max))
        self.c = torch.nn.Parameter(torch.randn(model.n_head, t_max))
        self.offer_key_bias = offer_key_bias
        self.bias_calls = 0

    def bias(self, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, ctx: PositionContext) -> Tensor:
        self.bias_calls += 1
        return self.b[:, k_pos][:, None, :] + self.c[:, q_pos][:, :, None]  # (H, Tq, Tk)

    def key_bias(self, k_pos: Tensor, ctx: PositionContext) -> Tensor | None:
        return self.b[:, k_pos] if self.offer_key_bias else None

    @property
    def offers_key_bias(self) -> bool:
        return self.offer_key_bias


def _count_key_bias_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import posenc_cli.attention.kernels as attention  # where the key-bias kernel looks it up

    calls = [0]
    real = attention.attend_key_bias

    def spy(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "attend_key_bias", spy)
    return calls


def test_key_bias_road_equals_naive_reference_and_chunked_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    T = 37
    scheme = KeyPlusRowBias(ModelConfig(d_model=32, n_head=4), T)
    ctx = PositionContext(positions=torch.arange(T))
    full = scheme.b[:, None, :] + scheme.c[:, :, None]  # (H, T, T), the bias as the scheme defines it
    calls = _count_key_bias_calls(monkeypatch)
    grads = []
    for chunk in (None, 5):  # None: key-bias road (fp32 on CPU); 5: the chunked bias path
        q, k, v = (t.requires_grad_() for t in qkv(T=T))
        scheme.zero_grad()
        out = attend(q, k, v, scheme, 0, ctx, chunk_size=chunk)
        torch.testing.assert_close(out.double(), naive_attention(q, k, v, full.detach()), rtol=1e-5, atol=1e-5)
        out.square().sum().backward()
        grads.append([q.grad, k.grad, v.grad, scheme.b.grad.clone()])
    assert calls[0] == 1
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_key_bias_road_only_where_it_is_precise(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    scheme = KeyPlusRowBias(ModelConfig(d_model=32, n_head=4), 23)
    ctx = PositionContext(positions=torch.arange(23))
    q, k, v = qkv()
    calls = _count_key_bias_calls(monkeypatch)
    attend(q, k, v, scheme, 0, ctx)
    assert calls[0] == 1  # fp32 on CPU, causal
    attend(q, k, v, scheme, 0, ctx, causal=False)  # b_h(j) + c_h(i) is a row shift only under the causal mask
    attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), scheme, 0, ctx)  # bf16 cannot hold b·√hd next to q·k
    attend(q, k, v, scheme, 0, ctx, chunk_size=4)  # forced chunking
    scheme.offer_key_bias = False  # a scheme without the hook
    attend(q, k, v, scheme, 0, PositionContext(positions=torch.arange(23)))
    assert calls[0] == 1


def test_shared_bias_is_built_once_per_forward() -> None:
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=32, n_layer=3, n_head=4), AlibiConfig(), 64, 16).eval()
    scheme = KeyPlusRowBias(model.config, 40, offer_key_bias=False)
    model.scheme = scheme
    idx = torch.randint(0, 64, (2, 40))
    shared = model(idx)
    assert scheme.bias_calls == 1  # one chunk for all 3 layers
    scheme.bias_shared_across_layers = False
    torch.testing.assert_close(model(idx), shared)
    assert scheme.bias_calls == 1 + 3


def test_alibi_key_bias_road_is_accurate_at_8192_tokens() -> None:
    """fp32 at T = 8192, 8 heads (slopes 1/2 … 1/256): the key-bias road against a float64 reference of
    softmax(q·kᵀ/√d − m_h·(i − j))·v on 192 query rows (first, middle, last 64).

    Stated tolerance, per head: |error| ≤ max(1e-5, 2·eps32·m_h·T). The augmented score holds m_h·j − centre, up to
    m_h·T/2 in magnitude, so fp32 rounds it by ~eps32·m_h·T/2; the attention output moves by at most a few times
    that (|v| ~ 1). Observed: 1.7e-4 for m = 1/2 (bound 9.8e-4) down to 1.1e-6 for m = 1/256 (bound 1e-5). The
    chunked path, which adds the bias after q·kᵀ, stays below 1e-6; bf16 would round b itself by ~m·T/256, which is
    why bf16 always takes the chunked path.
    """
    from posenc_cli.attention import attend_key_bias
    from posenc_cli.positional.alibi import alibi_key_bias

    H, hd, T = 8, 8, 8192
    q, k, v = qkv(B=1, H=H, T=T, d=hd)
    slopes, pos = alibi_slopes(H), torch.arange(T)
    with torch.no_grad():
        out = attend_key_bias(q, k, v, alibi_key_bias(slopes, pos))
    rows = torch.cat([torch.arange(0, 64), torch.arange(T // 2 - 32, T // 2 + 32), torch.arange(T - 64, T)])
    dist = (rows[:, None] - pos[None, :]).double()  # (R, T)
    scores = q[:, :, rows].double() @ k.double().transpose(-1, -2) / math.sqrt(hd)  # (1, H, R, T)
    scores = scores - slopes.double()[:, None, None] * dist  # −m_h·(i − j), from the paper
    scores = scores.masked_fill(dist < 0, float("-inf"))
    ref = torch.softmax(scores, dim=-1) @ v.double()  # (1, H, R, hd)
    err = (out[:, :, rows].double() - ref).abs().amax(dim=(0, 2, 3))  # (H,)
    bound = torch.clamp(2 * torch.finfo(torch.float32).eps * slopes.double() * T, min=1e-5)
    assert (err <= bound).all(), f"errors {err.tolist()} exceed {bound.tolist()}"


def sdpa_dtypes(monkeypatch: pytest.MonkeyPatch) -> list[torch.dtype]:
    """Record the dtype of q at every SDPA call of the attention kernels."""
    import posenc_cli.attention.kernels as attention

    seen: list[torch.dtype] = []
    real = attention.F.scaled_dot_product_attention

    def spy(q: Tensor, *args: object, **kwargs: object) -> Tensor:
        seen.append(q.dtype)
        return real(q, *args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    return seen


@pytest.mark.parametrize("name", ["nope", "alibi"])
def test_bf16_training_attends_in_fp32_on_cpu_up_to_the_length_limit(name: str, monkeypatch) -> None:
    """CPU's fused bf16 SDPA backward is slower than fp32's at short lengths: training attends in fp32 there; the
    result is the fp32 attention rounded once to bf16. Forward-only calls and longer inputs stay in bf16."""
    from posenc_cli.attention import FP32_GRAD_MAX_LEN
    from posenc_cli.positional import scheme_class

    model_cfg = ModelConfig(d_model=32, n_head=4)
    scheme = scheme_class(name)(AlibiConfig() if name == "alibi" else NopeConfig(), model_cfg, 16)
    seen = sdpa_dtypes(monkeypatch)
    cases = ((40, True, torch.float32), (40, False, torch.bfloat16), (FP32_GRAD_MAX_LEN + 1, True, None))
    for T, grad, expect in cases:
        seen.clear()
        q, k, v = (t.bfloat16().requires_grad_(grad) for t in qkv(B=1, T=T))
        ctx = PositionContext(positions=torch.arange(T))
        scheme.prepare(ctx)
        out = attend(q, k, v, scheme, 0, ctx)
        assert out.dtype == torch.bfloat16 and set(seen) == {expect or torch.bfloat16}, (T, grad)
        if expect == torch.float32:
            ref = attend(q.detach().float(), k.detach().float(), v.detach().float(), scheme, 0, ctx).bfloat16()
            assert torch.equal(out.detach(), ref)
            out.float().sum().backward()
            assert q.grad is not None and q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad).all()
