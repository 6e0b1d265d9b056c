"""PaTH attention (posenc_cli/positional/path.py): the logits against an explicit float64 product of Householder
matrices per pair, the reference code's decoding (cached keys updated by each new token's H), the blocked form
against the plain walk, KV-cache decoding, β = 0 as NoPE, and a CLI run that resumes bit for bit."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
from pathlib import Path

import pytest
import torch
from attention_utils import force_chunks
from torch import Tensor
from train_utils import metrics, same_weights, tiny_config, tiny_overrides, weights, write_corpus
from typer.testing import CliRunner

from posenc_cli.config import ModelConfig
from posenc_cli.errors import ConfigError
from posenc_cli.kv_cache import KVCache
from posenc_cli.model import GPT
from posenc_cli.positional.base import PositionContext
from posenc_cli.positional.nope import NopeConfig
from posenc_cli.positional.path import PaTH, PathConfig, path_scores
from posenc_cli.positional.span import Span

TINY = ModelConfig(d_model=32, n_layer=2, n_head=2)


def reflect(x: Tensor, w: Tensor, beta: Tensor) -> Tensor:
    """H x = x − β (x·w) w, row by row (H = I − β w wᵀ): x (..., d), w (..., d) and beta (..., 1) broadcastable."""
    return x - beta * (x * w).sum(-1, keepdim=True) * w


def path_scores_loop(q: Tensor, k: Tensor, w: Tensor, beta: Tensor) -> Tensor:
    """The plain walk: q (B, H, Tq, d), the queries of the last Tq of n tokens, k, w (B, H, n, d), beta (B, H, n) ->
    (B, H, Tq, n) q_iᵀ H_i ⋯ H_(j+1) k_j (unscaled) for j ≤ i; entries j > i are arbitrary (masked later).

    Walks j from n − 1 down, keeping U_i = H_(j+1) ⋯ H_i q_i for the queries i > j: one step per key."""
    n, Tq = k.shape[2], q.shape[2]
    rows = torch.arange(n - Tq, n, device=q.device)  # the queries' token indexes
    u, cols = q, []
    for j in range(n - 1, -1, -1):
        cols.append((u * k[:, :, j, None]).sum(-1))  # (B, H, Tq)
        if j > 0:  # H_j, for the keys before j; it joins the rows i >= j
            moved = reflect(u, w[:, :, j, None], beta[:, :, j, None, None])
            u = torch.where((rows >= j)[:, None], moved, u)
    return torch.stack(cols[::-1], dim=-1)


def scheme(seed: int = 0, **options: object) -> PaTH:
    """A PaTH scheme at TINY's sizes whose parameters are large enough that every H_t differs clearly from I."""
    torch.manual_seed(seed)
    s = PaTH(PathConfig(**options), TINY, 16)  # type: ignore[arg-type]
    with torch.no_grad():
        for p in s.parameters():
            p.normal_(std=0.5)
    return s


# -- an independent float64 reference --------------------------------------------------------------------------------


def reference_vectors(s: PaTH, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """x (B, T, D) -> w (B, H, T, hd), β (B, H, T), log f (B, H, T) or None in float64, token by token."""
    B, T, _ = x.shape
    H, hd = TINY.n_head, TINY.head_dim
    x = x.double()
    W = (s.w_up[layer].double() @ s.w_down[layer].double()) if s.low_rank else s.w_proj[layer].double()  # (H·hd, D)
    raw = (x @ W.T).view(B, T, H, hd)  # (B, T, H, hd)
    if s.conv is not None:  # fla's ShortConvolution: nn.Conv1d over H·hd channels, groups = channels, the first T
        kern = s.conv[layer].double().reshape(H * hd, 1, -1)  # outputs of padding K − 1 (causal)
        conv = torch.nn.functional.conv1d(
            raw.reshape(B, T, H * hd).transpose(1, 2), kern, padding=kern.shape[-1] - 1, groups=H * hd
        )[..., :T]  # (B, H·hd, T)
        raw = torch.nn.functional.silu(conv.transpose(1, 2)).view(B, T, H, hd)
    w = torch.zeros(B, H, T, hd, dtype=torch.float64)
    for t in range(T):
        v = raw[:, t]  # (B, H, hd)
        w[:, :, t] = v / torch.sqrt((v * v).sum(-1, keepdim=True) + 1e-6)
    beta = 2 * torch.sigmoid(x @ s.beta_proj[layer].double().T + s.beta_bias[layer].double()).transpose(1, 2)
    gate = None
    if s.forget_gate:
        z = x @ s.gate_proj[layer].double().T + s.gate_bias[layer].double()
        gate = torch.nn.functional.logsigmoid(z).transpose(1, 2)
    return w, beta, gate


def reference_logits(q, k, w, beta, gate, q_pos: range, k_pos: range) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Per pair, the paper's k_jᵀ (H_(j+1) ⋯ H_i) q_i, each H_s = I − β_s w_s w_sᵀ an explicit matrix, scaled by
    1/√hd after the gate sum is added (fla's kernel); NaN where j > i."""
    B, H, _, hd = q.shape
    out = torch.full((B, H, len(q_pos), len(k_pos)), float("nan"), dtype=torch.float64)
    eye = torch.eye(hd, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            mats = [eye - beta[b, h, t] * torch.outer(w[b, h, t], w[b, h, t]) for t in range(w.shape[2])]
            for a, i in enumerate(q_pos):
                for c, j in enumerate(k_pos):
                    if j > i:
                        continue
                    P = eye
                    for t in range(j + 1, i + 1):
                        P = P @ mats[t]
                    score = k[b, h, j].double() @ P @ q[b, h, i].double()
                    if gate is not None:
                        score = score + gate[b, h, j + 1 : i + 1].sum()
                    out[b, h, a, c] = score / math.sqrt(hd)
    return out


def run_logits(s: PaTH, layer: int, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, qs: range, ks: range):  # type: ignore[no-untyped-def]
    ctx = PositionContext(torch.arange(x.shape[1]))
    ctx.content[layer] = s.content(layer, x, ctx)
    with torch.no_grad():
        return s.logits(
            layer,
            q[:, :, qs.start : qs.stop],
            k[:, :, ks.start : ks.stop],
            torch.arange(qs.start, qs.stop),
            torch.arange(ks.start, ks.stop),
            ctx,
        )


@pytest.mark.parametrize(
    "options",
    [{}, {"forget_gate": True}, {"w_rank": 0, "conv_size": 1}, {"conv_size": 4}],
    ids=["default", "forget-gate", "full-rank-no-conv", "conv-4"],
)
def test_logits_equal_the_explicit_householder_products(options: dict) -> None:
    s = scheme(**options)
    T, layer = 11, 1
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, T, TINY.d_model, generator=g)
    q, k = (torch.randn(2, TINY.n_head, T, TINY.head_dim, generator=g) for _ in range(2))
    with torch.no_grad():
        w, beta, gate = reference_vectors(s, layer, x)
    for qs, ks in ((range(0, T), range(0, T)), (range(6, 9), range(4, 9)), (range(T - 1, T), range(0, T))):
        ref = reference_logits(q, k, w, beta, gate, qs, ks)
        out = run_logits(s, layer, x, q, k, qs, ks)
        seen = ~ref.isnan()
        assert out.dtype == torch.float32 and seen.any()
        torch.testing.assert_close(out.double()[seen], ref[seen], rtol=1e-5, atol=1e-5)


def test_a_chunk_whose_first_key_is_late_still_sees_the_convolution_of_earlier_tokens() -> None:
    """Keys [4, 9): w_5 reads tokens 3..5 through the kernel of 3, so changing token 3 changes the chunk's logits
    (and token 2, outside every kernel the chunk uses, does not)."""
    s = scheme()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 9, TINY.d_model, generator=g)
    q, k = (torch.randn(1, TINY.n_head, 9, TINY.head_dim, generator=g) for _ in range(2))
    base = run_logits(s, 0, x, q, k, range(6, 9), range(4, 9))
    for token, changes in ((3, True), (2, False)):
        y = x.clone()
        y[:, token] += 1.0
        other = run_logits(s, 0, y, q, k, range(6, 9), range(4, 9))
        assert changes == (not torch.allclose(other, base, rtol=0, atol=0, equal_nan=True)), token


def test_logits_follow_the_reference_codes_decoding_order() -> None:
    """fla's decoding (`fla/layers/path_attn.py`): each new token's H_t updates every cached key, k ← k − β (k·w) w,
    before its own key joins the cache; query t then reads q_t·k. Written here as that loop over tokens."""
    s = scheme()
    T, layer = 9, 0
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, T, TINY.d_model, generator=g)
    q, k = (torch.randn(2, TINY.n_head, T, TINY.head_dim, generator=g) for _ in range(2))
    with torch.no_grad():
        w, beta, _ = reference_vectors(s, layer, x)
    cache = torch.zeros(2, TINY.n_head, 0, TINY.head_dim, dtype=torch.float64)
    rows = []
    for t in range(T):
        wt, bt = w[:, :, t, None], beta[:, :, t, None, None]
        cache = cache - bt * (cache * wt).sum(-1, keepdim=True) * wt
        cache = torch.cat([cache, k[:, :, t, None].double()], dim=2)  # (B, H, t + 1, hd)
        rows.append((cache @ q[:, :, t, :, None].double())[..., 0] / math.sqrt(TINY.head_dim))  # (B, H, t + 1)
    out = run_logits(s, layer, x, q, k, range(T), range(T)).double()
    for t, row in enumerate(rows):
        torch.testing.assert_close(out[:, :, t, : t + 1], row, rtol=1e-5, atol=1e-5)


# -- the blocked form ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "Tq", "block"), [(13, 13, 4), (13, 5, 4), (16, 16, 4), (7, 1, 4), (20, 3, 8), (5, 5, 8)])
def test_blocked_scores_equal_the_walk_with_gradients(n: int, Tq: int, block: int) -> None:
    g = torch.Generator().manual_seed(n * 100 + Tq)
    q = torch.randn(2, 3, Tq, 6, generator=g, dtype=torch.float64, requires_grad=True)
    k, w = (torch.randn(2, 3, n, 6, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    beta = (2 * torch.rand(2, 3, n, generator=g, dtype=torch.float64)).requires_grad_()
    wn = torch.nn.functional.normalize(w, dim=-1)
    seen = torch.arange(n)[None, :] <= torch.arange(n - Tq, n)[:, None]  # (Tq, n)
    a, b = path_scores_loop(q, k, wn, beta)[..., seen], path_scores(q, k, wn, beta, block)[..., seen]
    torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
    weight = torch.randn(a.shape, generator=g, dtype=torch.float64)
    grads_a = torch.autograd.grad((a * weight).sum(), (q, k, w, beta), retain_graph=True)
    grads_b = torch.autograd.grad((b * weight).sum(), (q, k, w, beta))
    for ga, gb in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(gb, ga, rtol=1e-10, atol=1e-10)


def test_chunks_reuse_the_carried_blocks_of_earlier_chunks_exactly() -> None:
    """Chunks of 5 queries over the prefixes of 23 keys, blocks of 4 following absolute token indexes (`lead`), each
    chunk extending the carried blocks of the ones before: every chunk equals the walk."""
    g = torch.Generator().manual_seed(8)
    q, k, w = (torch.randn(2, 3, 23, 6, generator=g, dtype=torch.float64) for _ in range(3))
    w = torch.nn.functional.normalize(w, dim=-1)
    beta = 2 * torch.rand(2, 3, 23, generator=g, dtype=torch.float64)
    ref, carried = path_scores_loop(q, k, w, beta), {}
    for start in range(0, 23, 5):
        end = min(start + 5, 23)
        out = path_scores(q[:, :, start:end], k[:, :, :end], w[:, :, :end], beta[:, :, :end], 4, carried=carried)
        seen = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
        torch.testing.assert_close(out[..., seen], ref[:, :, start:end, :end][..., seen], rtol=1e-12, atol=1e-12)
        assert out[..., ~seen].isnan().all()
        assert carried["k_hat"].shape[0] == (end - 1) // 4  # the blocks before the last query's
    for lead in (1, 3):
        out = path_scores(q[:, :, 9:], k[:, :, 2:], w[:, :, 2:], beta[:, :, 2:], 4, lead=lead)
        torch.testing.assert_close(
            out,
            path_scores_loop(q[:, :, 9:], k[:, :, 2:], w[:, :, 2:], beta[:, :, 2:]).masked_fill(
                out.isnan(), float("nan")
            ),
            rtol=1e-12,
            atol=1e-12,
            equal_nan=True,
        )


def test_carried_blocks_are_not_reused_for_other_keys() -> None:
    """One context, the logits of other keys (another tensor, or the same one changed in place) are computed afresh:
    10 queries against 70 keys run in blocks of 32, so two blocks are carried and kept in the context."""
    s, T, layer = scheme(), 70, 0
    g = torch.Generator().manual_seed(9)
    x = torch.randn(1, T, TINY.d_model, generator=g)
    q, k1, k2 = (torch.randn(1, TINY.n_head, T, TINY.head_dim, generator=g) for _ in range(3))
    q, rows, pos = q[:, :, 60:], torch.arange(60, T), torch.arange(T)
    shared = PositionContext(pos)
    shared.content[layer] = s.content(layer, x, shared)

    def fresh(k: torch.Tensor) -> torch.Tensor:
        ctx = PositionContext(pos)
        ctx.content[layer] = shared.content[layer]
        return s.logits(layer, q, k, rows, pos, ctx)

    with torch.no_grad():
        for k in (k1, k2):
            torch.testing.assert_close(s.logits(layer, q, k, rows, pos, shared), fresh(k), equal_nan=True)
        assert shared.tables["path_carried"]["data"]["k_hat"].shape[0] == 2
        k2.mul_(2.0)  # in place: a new version of the same tensor
        torch.testing.assert_close(s.logits(layer, q, k2, rows, pos, shared), fresh(k2), equal_nan=True)


# -- inside the model ------------------------------------------------------------------------------------------------


def model(seed: int = 0, **options: object) -> GPT:
    torch.manual_seed(seed)
    gpt = GPT(TINY, PathConfig(**options), 48, 16)  # type: ignore[arg-type]
    with torch.no_grad():
        for p in gpt.scheme.parameters():
            p.normal_(std=0.5)
    return gpt.eval()


@pytest.mark.parametrize("options", [{}, {"forget_gate": True}], ids=["default", "forget-gate"])
def test_kv_cache_decoding_equals_the_full_forward(options: dict) -> None:
    gpt = model(**options)
    idx = torch.randint(0, 48, (2, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = gpt(idx)
        cache, pieces, start = gpt.new_cache(), [], 0
        for n in (7, 1, 1, 4, 1, 6):
            pieces.append(gpt(idx[:, start : start + n], cache=cache))
            start += n
    assert isinstance(cache, KVCache) and cache.content[0].shape == (
        2,
        TINY.n_head,
        20,
        TINY.head_dim + 1 + bool(options),
    )
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-5)


def test_beta_zero_is_nope() -> None:
    """β = 0 makes every H_t the identity: the logits are q·k/√hd, NoPE's, for the same weights."""
    path = model()
    with torch.no_grad():
        path.scheme.beta_proj.zero_()
        path.scheme.beta_bias.fill_(-1e4)  # 2σ(−10⁴) = 0 in fp32
    torch.manual_seed(0)
    nope = GPT(TINY, NopeConfig(), 48, 16).eval()
    own = {k: v for k, v in path.state_dict().items() if not k.startswith("scheme.")}
    nope.load_state_dict(own)
    idx = torch.randint(0, 48, (2, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(path(idx), nope(idx), rtol=1e-5, atol=1e-5)
        path.scheme.beta_bias.fill_(0.0)  # control: β = 1
        assert (path(idx) - nope(idx)).abs().max() > 1e-4  # small at init (q, k of std 0.02), far above 1e-5


def test_non_causal_is_refused_and_options_are_checked() -> None:
    gpt = model()
    idx = torch.randint(0, 48, (1, 12))
    with torch.no_grad():
        assert torch.isfinite(gpt(idx)).all()
        for chunks in (None, 5):  # one chunk, and chunks whose keys reach past their queries
            if chunks:
                force_chunks(gpt, chunks)
            with pytest.raises(ValueError, match="causal attention only"):
                gpt(idx, causal=False)
    for bad in ({"w_rank": -1}, {"conv_size": 0}):
        with pytest.raises(ConfigError):
            PathConfig(**bad).validate()  # type: ignore[arg-type]


def test_position_ids_change_nothing() -> None:
    gpt = model()
    idx = torch.randint(0, 48, (2, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(gpt(idx, position_ids=torch.arange(12).flip(0) * 7), gpt(idx), rtol=0, atol=0)


@pytest.mark.parametrize("span", [Span("sliding", 4), Span("chunked", 5)], ids=lambda s: s.kind)
def test_a_span_hides_keys_but_leaves_the_seen_logits_as_in_full_attention(span: Span) -> None:
    """Through the Scored kernel in chunks of 3 queries, each chunk's keys start at the span's first key (> 0), and
    the output equals softmax over the full-attention logits masked by the span (the products do not depend on
    which keys a chunk was given)."""
    from posenc_cli.attention import attend

    s, T, layer = scheme(), 14, 1
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, T, TINY.d_model, generator=g)
    q, k, v = (torch.randn(2, TINY.n_head, T, TINY.head_dim, generator=g) for _ in range(3))
    ctx = PositionContext(torch.arange(T))
    ctx.content[layer] = s.content(layer, x, ctx)
    pos = torch.arange(T)
    with torch.no_grad():
        out = attend(q, k, v, s, layer, ctx, chunk_size=3, span=span)
        logits = s.logits(layer, q, k, pos, pos, ctx)
    visible = (pos[None, :] <= pos[:, None]) & span.visible(pos, pos)
    ref = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1) @ v
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


# -- training from the CLI -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def test_trains_from_the_cli(corpus: Path, tmp_path: Path) -> None:
    from posenc_cli.cli import app

    out = tmp_path / "run"
    args = ["train", *tiny_overrides(corpus, steps=3, eval_every=3, save_every=3), "pos=path", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert [m[0] for m in metrics(out)] == [1, 2, 3]
    assert any(k.startswith("scheme.w_down") for k in weights(out))


def test_an_interrupted_run_resumes_bit_for_bit(corpus: Path, tmp_path: Path) -> None:
    from posenc_cli.run.train import train

    steps = {"steps": 6, "save_every": 4, "eval_every": 6}
    cfg = tiny_config(corpus, pos="path", **steps)
    train(cfg, tmp_path / "ref")

    def stop_at_3(event: dict) -> None:
        if event["event"] == "step" and event["step"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    run = tmp_path / "run"
    assert train(tiny_config(corpus, pos="path", **steps), run, callback=stop_at_3).step == 3
    assert train(tiny_config(corpus, pos="path", **steps), run, resume=True).step == 6
    assert same_weights(weights(run), weights(tmp_path / "ref"))
    assert metrics(run) == metrics(tmp_path / "ref")


def test_sizes_follow_the_model() -> None:
    s = PaTH(PathConfig(), dataclasses.replace(TINY, d_model=64, n_head=4), 16)
    assert s.w_down.shape == (2, 32, 64) and s.w_up.shape == (2, 64, 32) and s.conv.shape == (2, 4, 16, 3)
    assert s.beta_proj.shape == (2, 4, 64) and not s.beta_bias.any()


def test_inference_mode_forward_by_chunks_equals_the_no_grad_one() -> None:
    """Evaluation runs under torch.inference_mode, whose tensors keep no version counter: the carried blocks of a
    chunked forward must work there and give the no_grad logits (a sweep's evaluation failed on it)."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=16, n_layer=2, n_head=2), PathConfig(), 11, 8).eval()
    force_chunks(model, 4)  # several query chunks, so blocks are carried between them
    idx = torch.randint(0, 11, (2, 21))
    with torch.no_grad():
        ref = model(idx)
    with torch.inference_mode():
        got = model(idx)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)
