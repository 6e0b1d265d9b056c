"""The contract every positional scheme keeps, parametrised over the registry: a new file in `posenc_cli/positional/`
is tested here the moment it exists, with no list to extend.

Shapes, causality (and the refusal of a non-causal forward by the `causal_only` schemes), a finite loss with
gradients for every scheme parameter, training on a fixed batch, bf16 autocast, a save/load round trip through the
saved config, inputs longer than training (or the scheme's refusal), chunked attention, and position ids: explicit
`arange` ids give the default result, a common shift of the ids changes nothing for the schemes marked `relative`
(and something for the others), (B, T) ids give each row what it would get alone, and causality follows token order
whatever the ids.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from attention_utils import force_chunks
from scheme_utils import lively, n_layer_for, plain_schemes

from posenc_cli.config import Config, ModelConfig, TrainConfig, config_to_dict
from posenc_cli.errors import LengthBeyondScheme
from posenc_cli.model import GPT, build_model
from posenc_cli.positional import PositionalScheme, PositionContext, config_class, registry
from posenc_cli.positional.span import Span
from posenc_cli.run.config_load import config_from_dict

SCHEMES = sorted(registry())
TINY = ModelConfig(d_model=32, n_layer=2, n_head=2)
VOCAB = 48
TRAIN_LENGTH = 16


def make(name: str, seed: int = 0, train_length: int = TRAIN_LENGTH) -> GPT:
    """`name` at TINY's sizes, a layout as deep as its pattern (a pattern must fit the model)."""
    torch.manual_seed(seed)
    return GPT(dataclasses.replace(TINY, n_layer=n_layer_for(name)), config_class(name)(), VOCAB, train_length)


def extrapolates(name: str) -> bool:
    return registry()[name].extrapolates


def tokens(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def logits(model: GPT, idx: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad():
        return model(idx, position_ids=ids)


# -- shapes, causality, loss and gradients ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCHEMES)
def test_logits_have_the_vocabulary_shape(name: str) -> None:
    model = lively(make(name))
    assert logits(model, tokens(3, 11)).shape == (3, 11, VOCAB)


@pytest.mark.parametrize("name", SCHEMES)
def test_future_tokens_do_not_change_past_logits(name: str) -> None:
    T, cut = (24, 12) if extrapolates(name) else (16, 10)  # past the training length where the scheme allows it
    model = lively(make(name))
    idx = tokens(2, T)
    changed = idx.clone()
    changed[:, cut:] = (changed[:, cut:] + 1) % VOCAB
    a, b = logits(model, idx), logits(model, changed)
    torch.testing.assert_close(a[:, :cut], b[:, :cut])
    assert not torch.allclose(a[:, cut:], b[:, cut:])


def test_the_schemes_summing_over_the_keys_up_to_the_query_are_marked_causal_only() -> None:
    """CoPE counts gates, FoX sums log-gates, stick-breaking breaks the stick and PaTH multiplies transforms over the
    keys between key and query: none defines a logit for a later key."""
    assert {n for n in SCHEMES if registry()[n].causal_only} == {"cope", "fox", "path", "stickbreaking"}


@pytest.mark.parametrize("name", SCHEMES)
def test_a_non_causal_forward_is_refused_exactly_for_the_causal_only_schemes(name: str) -> None:
    """A `causal_only` scheme defines no logit for a key after its query: the model refuses `causal=False`. Every
    other scheme gives finite logits that see the future (the mask is gone)."""
    model = lively(make(name))
    idx = tokens(2, 12)
    if model.scheme.causal_only:
        with pytest.raises(ValueError, match="causal attention only"):
            model(idx, causal=False)
        return
    changed = idx.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(idx, causal=False), model(changed, causal=False)
    assert torch.isfinite(a).all()
    assert not torch.allclose(a[:, :8], b[:, :8])


@pytest.mark.parametrize("name", SCHEMES)
def test_loss_is_finite_and_every_scheme_parameter_gets_a_gradient(name: str) -> None:
    model = make(name)
    data = tokens(2, TRAIN_LENGTH + 1)
    loss = F.cross_entropy(model(data[:, :-1]).flatten(0, 1), data[:, 1:].flatten())
    assert torch.isfinite(loss)
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
    for pname, p in model.scheme.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}: no gradient reaches {pname}"


@pytest.mark.parametrize("name", SCHEMES)
def test_trains_on_a_fixed_batch(name: str) -> None:
    model = make(name, seed=1)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, VOCAB, (4, TRAIN_LENGTH + 1), generator=g)
    x, y = data[:, :-1], data[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(VOCAB), rel=0.05)  # small init: uniform predictions
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.parametrize("name", SCHEMES)
def test_bf16_autocast_forward(name: str) -> None:
    model = make(name)
    idx = tokens(2, TRAIN_LENGTH)
    ref = model(idx)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(idx)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() < 0.05
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(lively(model)(idx).float()).all()


# -- checkpoints -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCHEMES)
def test_checkpoint_holds_only_learned_parameters(name: str) -> None:
    scheme = make(name).scheme
    assert set(scheme.state_dict()) == {k for k, _ in scheme.named_parameters()}


@pytest.mark.parametrize("name", SCHEMES)
def test_save_load_round_trip(name: str, tmp_path: Path) -> None:
    """Weights and the saved config rebuild a model with the same logits, bit for bit."""
    torch.manual_seed(0)
    model_cfg = dataclasses.replace(TINY, n_layer=n_layer_for(name))
    cfg = Config(model=model_cfg, pos=config_class(name)(), train=TrainConfig(seq_len=TRAIN_LENGTH))
    model = lively(build_model(cfg, VOCAB))
    torch.save(model.state_dict(), tmp_path / "model.pt")
    saved = config_to_dict(cfg)
    torch.manual_seed(1)  # a different initialisation, overwritten by the load
    again = build_model(config_from_dict(saved, saved=True), VOCAB).eval()
    again.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    idx = tokens(2, TRAIN_LENGTH)
    assert torch.equal(logits(model, idx), logits(again, idx))


# -- longer inputs and chunked attention ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCHEMES)
def test_runs_at_four_times_training_length_or_refuses(name: str) -> None:
    model = lively(make(name))
    idx = tokens(1, 4 * TRAIN_LENGTH)
    if not extrapolates(name):
        with pytest.raises(LengthBeyondScheme):
            model(idx)
        return
    out = logits(model, idx)
    assert out.shape == (1, 4 * TRAIN_LENGTH, VOCAB) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", SCHEMES)
def test_chunked_attention_equals_unchunked(name: str) -> None:
    T = 4 * TRAIN_LENGTH if extrapolates(name) else TRAIN_LENGTH
    model = lively(make(name))
    idx = tokens(2, T)
    full = logits(model, idx)
    force_chunks(model, 5)  # uneven chunks of queries
    chunked = logits(model, idx)
    assert torch.isfinite(full).all()
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)


# -- position ids ----------------------------------------------------------------------------------------------------


def skipping_ids(T: int, skip: int) -> torch.Tensor:
    """0..T/2−1, then the rest of the ids `skip` further on (the shape of a PoSE chunk)."""
    ids = torch.arange(T)
    ids[T // 2 :] += skip
    return ids


@pytest.mark.parametrize("name", SCHEMES)
def test_explicit_arange_ids_give_the_default_logits(name: str) -> None:
    """Measured bitwise equal for every scheme; 1e-6 leaves room for a path that legitimately differs."""
    model = lively(make(name))
    for T in (TRAIN_LENGTH, 24) if extrapolates(name) else (TRAIN_LENGTH,):
        idx = tokens(2, T)
        ref = logits(model, idx)
        for ids in (torch.arange(T), torch.arange(T)[None], torch.arange(T).expand(2, T)):
            torch.testing.assert_close(logits(model, idx, ids), ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", SCHEMES)
def test_chunked_attention_with_ids_equals_unchunked(name: str) -> None:
    T = 24 if extrapolates(name) else 12
    model = lively(make(name))
    idx = tokens(2, T)
    ids = torch.stack([skipping_ids(T, 3 if T == 12 else 29), torch.arange(T) + 2])  # (B, T), rows differ
    full = logits(model, idx, ids)
    force_chunks(model, 5)
    torch.testing.assert_close(logits(model, idx, ids), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", SCHEMES)
def test_a_common_shift_of_the_ids_changes_exactly_the_non_relative_schemes(name: str) -> None:
    """`relative` schemes see ids only through id_i − id_j: shifting them all leaves the logits to 1e-5 (RoPE and
    xPos round their angles differently); every other scheme reads absolute ids, and the shift shows."""
    T = 12
    model = lively(make(name))
    idx = tokens(2, T)
    base = torch.arange(T)
    ref = logits(model, idx, base)
    for shift in (1, 2):  # within a 16-row learned table; not 3, which turns θ = 1 by 6 ≈ 2π (FoPE's only one here)
        shifted = logits(model, idx, base + shift)
        if model.scheme.relative:
            torch.testing.assert_close(shifted, ref, rtol=0, atol=1e-5)
        else:
            assert (shifted - ref).abs().max() > 1e-4, f"{name} is not marked relative but ignores a shift"
    if model.scheme.relative and extrapolates(name):
        far = torch.stack([base + 37, skipping_ids(T, 5) + 200])  # per-row shifts of two different id patterns
        alone = logits(model, idx, torch.stack([base, skipping_ids(T, 5)]))
        torch.testing.assert_close(logits(model, idx, far), alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", SCHEMES)
def test_each_row_of_batched_ids_gets_what_it_would_get_alone(name: str) -> None:
    T = 12
    model = lively(make(name))
    idx = tokens(3, T)
    ids = torch.stack([torch.arange(T), skipping_ids(T, 3), torch.arange(T) + 4])  # all < 16: fits learned tables
    together = logits(model, idx, ids)
    for b in range(3):
        alone = logits(model, idx[b : b + 1], ids[b])
        torch.testing.assert_close(together[b : b + 1], alone, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", SCHEMES)
def test_causality_follows_token_order_whatever_the_ids(name: str) -> None:
    """Ids out of token order (reversed, repeated): a later token still never reaches an earlier one's logits."""
    T, cut = 12, 7
    model = lively(make(name))
    idx = tokens(2, T)
    changed = idx.clone()
    changed[:, cut:] = (changed[:, cut:] + 1) % VOCAB
    reversed_ids = torch.arange(T).flip(0)
    repeated = torch.arange(T) // 3  # groups of three tokens share an id
    for ids in (reversed_ids, torch.stack([reversed_ids, repeated])):
        a, b = logits(model, idx, ids), logits(model, changed, ids)
        torch.testing.assert_close(a[:, :cut], b[:, :cut])


@pytest.mark.parametrize("name", SCHEMES)
def test_ids_past_the_schemes_limit_are_refused_like_lengths(name: str) -> None:
    model = lively(make(name))
    limit = model.scheme.max_length
    idx = tokens(1, 4)
    if limit is None:
        assert torch.isfinite(logits(model, idx, torch.tensor([0, 1, 500, 1000]))).all()
        return
    logits(model, idx, torch.tensor([0, 1, 2, limit - 1]))  # the last row of the table: served
    with pytest.raises(LengthBeyondScheme, match=rf"at most {limit} positions; {limit + 1} were requested"):
        logits(model, idx, torch.tensor([0, 1, 2, limit]))


# -- the KV cache's query rows -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", plain_schemes())  # a hybrid's hooks are its layers' schemes'
def test_rotate_rows_is_rotate_on_those_rows_bit_for_bit(name: str) -> None:
    """`rotate_rows` (KV-cache decoding: the new query rows alone) gives exactly `rotate`'s rows and keys, for
    default, shared and per-row ids."""
    model = make(name)
    T = 12
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, TINY.n_head, T, TINY.head_dim, generator=g) for _ in range(2))
    for ids in (None, skipping_ids(T, 3), torch.stack([skipping_ids(T, 3), torch.arange(T) + 1])):
        ctx = model.context(tokens(2, T), ids)
        full_q, full_k = model.scheme.rotate(q, k, ctx)
        for start in (1, T // 2, T - 1):
            rows_q, rows_k = model.scheme.rotate_rows(q[:, :, start:], k, ctx, start)
            assert torch.equal(rows_q, full_q[:, :, start:]) and torch.equal(rows_k, full_k), (ids, start)


# -- FlexAttention: the score_mod hook -------------------------------------------------------------------------------

FLEX_SCHEMES = [n for n in plain_schemes() if registry()[n].score_mod is not PositionalScheme.score_mod]
FLEX_LENGTHS = (TRAIN_LENGTH // 2, TRAIN_LENGTH, 40)  # below, at and beyond the training length


def dense_score_mod(scheme: PositionalScheme, layer: int, ctx: PositionContext, B: int) -> torch.Tensor:
    """The scheme's score_mod on zero scores, evaluated on broadcast index tensors -> (B, H, T, T)."""
    T, H = ctx.seq_len, scheme.n_head
    mod = scheme.score_mod(layer, ctx)
    b, h = torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None]
    i, j = torch.arange(T)[None, None, :, None], torch.arange(T)[None, None, None, :]
    return mod(torch.zeros(B, H, T, T), b, h, i, j).expand(B, H, T, T)


def flex_contexts(T: int) -> list[tuple[torch.Tensor | None, int]]:
    """(ids, B): the default ids; beyond the training length also skipping (T,) ids and (B, T) ids, one row per
    sequence (FlexAttention's eager reference is slow per call)."""
    if T <= TRAIN_LENGTH:
        return [(None, 2)]
    return [(None, 2), (skipping_ids(T, 7), 2), (torch.stack([torch.arange(T), torch.arange(T) + 5]), 2)]


@pytest.mark.parametrize("name", FLEX_SCHEMES)
def test_score_mod_equals_the_bias_hook_with_its_gradients(name: str) -> None:
    """Where causal attention looks (j <= i): values to 1e-5 fp32 and every scheme parameter's gradient."""
    model = lively(make(name))
    scheme = model.scheme
    for T in FLEX_LENGTHS:
        for ids, B in flex_contexts(T):
            for layer in range(TINY.n_layer):
                ctx = flex_ctx(scheme, T, ids)
                pos = ctx.token_index
                seen = pos[None, :] <= pos[:, None]  # (T, T) causal
                ref = scheme.bias(layer, torch.zeros(B, 1, T, 1), torch.zeros(B, 1, T, 1), pos, pos, ctx)
                ref = ref.expand(B, TINY.n_head, T, T)
                out = dense_score_mod(scheme, layer, ctx, B)
                torch.testing.assert_close(out[..., seen], ref[..., seen], rtol=1e-5, atol=1e-5)
                w = torch.randn(B, TINY.n_head, T, T, generator=torch.Generator().manual_seed(T))[..., seen]
                params = list(scheme.parameters())
                if params:
                    g_ref = torch.autograd.grad((ref[..., seen] * w).sum(), params, allow_unused=True)
                    flex_ctx(scheme, T, ids, ctx)  # tables again: the graph of `prepare` was freed
                    out = dense_score_mod(scheme, layer, ctx, B)
                    g_out = torch.autograd.grad((out[..., seen] * w).sum(), params, allow_unused=True)
                    for p, a, b in zip(params, g_out, g_ref, strict=True):
                        assert (a is None) == (b is None), p.shape
                        if a is not None:
                            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def flex_ctx(
    scheme: PositionalScheme, T: int, ids: torch.Tensor | None, ctx: PositionContext | None = None
) -> PositionContext:
    """A prepared context for T tokens: the default ids, or explicit ones (ctx: re-prepared in place)."""
    if ctx is None:
        if ids is None:
            ctx = PositionContext(torch.arange(T))
        else:
            ctx = PositionContext(ids, index=torch.arange(T), max_position=int(ids.max()))
    ctx.tables.clear()
    scheme.prepare(ctx)
    return ctx


@pytest.mark.parametrize("name", FLEX_SCHEMES)
def test_flex_road_gives_the_reference_logits(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model with FlexAttention forced on CPU (PyTorch's eager reference of it) equals today's roads to 1e-5
    fp32, below, at and beyond the training length, with default, skipping and (B, T) ids."""
    from posenc_cli.attention import choose, flex

    model = lively(make(name))
    refs = {}
    for T in FLEX_LENGTHS:
        for n, (ids, B) in enumerate(flex_contexts(T)):
            refs[T, n] = logits(model, tokens(B, T, seed=T), ids)
    calls = []
    monkeypatch.setattr(choose, "FLEX_MIN_LEN", {("cpu", torch.float32): 0})
    monkeypatch.setattr(choose, "KEY_BIAS_DEVICES", ())  # ALiBi's key-bias road would stay ahead of flex
    monkeypatch.setattr(flex, "COMPILE", False)
    monkeypatch.setattr(flex.Flex, "__call__", spy(flex.Flex.__call__, calls))
    for T in FLEX_LENGTHS:
        for n, (ids, B) in enumerate(flex_contexts(T)):
            out = logits(model, tokens(B, T, seed=T), ids)
            torch.testing.assert_close(out, refs[T, n], rtol=1e-5, atol=1e-5)
    assert len(calls) == len(refs) * TINY.n_layer  # every layer of every forward took the road


def spy(fn, calls: list):  # type: ignore[no-untyped-def]
    def wrapped(*args, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        return fn(*args, **kw)

    return wrapped


@pytest.mark.parametrize("name", FLEX_SCHEMES)
@pytest.mark.parametrize("span", [Span("sliding", 5), Span("chunked", 6)], ids=lambda s: s.kind)
def test_flex_road_with_a_span_equals_the_windowed_reference(
    name: str, span: Span, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sliding window or chunks as FlexAttention's block mask: the attention output equals the windowed road's (the
    scheme's bias, span and causal masks folded) to 1e-5 fp32, below, at and beyond the training length."""
    from posenc_cli.attention import Flex, attend, choose, flex
    from posenc_cli.attention.state import AttentionState

    model = lively(make(name))
    scheme = model.scheme
    g = torch.Generator().manual_seed(0)
    for T in FLEX_LENGTHS:
        for ids, B in flex_contexts(T)[:1] if T <= TRAIN_LENGTH else flex_contexts(T)[::2]:  # default, (B, T) ids
            ctx = flex_ctx(scheme, T, ids)
            q, k, v = (torch.randn(B, TINY.n_head, T, TINY.head_dim, generator=g) for _ in range(3))
            with torch.no_grad():
                ref = attend(q, k, v, scheme, 1, ctx, span=span)
                with monkeypatch.context() as m:
                    m.setattr(choose, "FLEX_MIN_LEN", {("cpu", torch.float32): 0})
                    m.setattr(flex, "COMPILE", False)
                    state = AttentionState(scheme, ctx)
                    out = attend(q, k, v, scheme, 1, ctx, span=span, state=state)
                    assert all(isinstance(kern, Flex) for kern in state.kernels.values())
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
