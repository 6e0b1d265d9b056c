"""Contract of the KV cache (posenc_cli/kv_cache.py): decoding with a cache gives the full forward's logits (1e-5,
fp32) for every registered scheme (a new scheme file is tested here with no edit), every RoPE scaling method, the
remaps and the attention scalings; prefill + one token at a time, several tokens at a time, explicit ids, eviction."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from scheme_utils import lively

from posenc_cli.config import ModelConfig, RemapConfig
from posenc_cli.kv_cache import KVCache
from posenc_cli.model import GPT
from posenc_cli.positional import config_class, registry
from posenc_cli.positional.rope import RopeConfig
from posenc_cli.rope_scaling import RopeScalingConfig
from posenc_cli.rope_scaling import registry as scaling_registry

SCHEMES = sorted(registry())
TINY = ModelConfig(d_model=32, n_layer=2, n_head=2)
VOCAB = 48
TRAIN_LENGTH = 16
ATOL = 1e-5


def make(pos, model: ModelConfig = TINY, seed: int = 0) -> GPT:
    """A lively model of `pos`, deep enough for a layout's whole pattern."""
    torch.manual_seed(seed)
    model = dataclasses.replace(model, n_layer=max(model.n_layer, len(getattr(pos, "layers", ()))))
    return lively(GPT(model, pos, VOCAB, TRAIN_LENGTH))


def tokens(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def decoded(model: GPT, idx: torch.Tensor, steps: list[int], ids: torch.Tensor | None = None) -> torch.Tensor:
    """Logits of idx fed in pieces of the sizes in `steps` through one cache, concatenated (B, T, V)."""
    cache = model.new_cache()
    out, start = [], 0
    with torch.no_grad():
        for n in steps:
            piece_ids = None if ids is None else ids[..., start : start + n]
            out.append(model(idx[:, start : start + n], cache=cache, position_ids=piece_ids))
            start += n
    assert start == idx.shape[1] and cache.length == start
    return torch.cat(out, dim=1)


def full(model: GPT, idx: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad():
        return model(idx, position_ids=ids)


def check(model: GPT, T: int, B: int = 2) -> None:
    idx = tokens(B, T)
    reference = full(model, idx)
    one_at_a_time = [T // 2] + [1] * (T - T // 2)
    torch.testing.assert_close(decoded(model, idx, one_at_a_time), reference, atol=ATOL, rtol=0)
    in_pieces = [3, 5, 1, T - 9]
    torch.testing.assert_close(decoded(model, idx, in_pieces), reference, atol=ATOL, rtol=0)


def length_for(name: str) -> int:
    """Past the training length where the scheme extrapolates, at it otherwise."""
    return 24 if registry()[name].extrapolates else TRAIN_LENGTH


@pytest.mark.parametrize("name", SCHEMES)
def test_cached_decoding_equals_the_full_forward_for_every_scheme(name: str) -> None:
    check(make(config_class(name)()), length_for(name))


@pytest.mark.parametrize("name", SCHEMES)
def test_cached_decoding_with_explicit_ids_equals_the_full_forward(name: str) -> None:
    model = make(config_class(name)())
    T = TRAIN_LENGTH if registry()[name].extrapolates else TRAIN_LENGTH // 2
    idx = tokens(2, T)
    ids = torch.sort(torch.randperm(TRAIN_LENGTH, generator=torch.Generator().manual_seed(1))[:T]).values
    reference = full(model, idx, ids)
    torch.testing.assert_close(decoded(model, idx, [T // 2] + [1] * (T - T // 2), ids), reference, atol=ATOL, rtol=0)


@pytest.mark.parametrize("method", sorted(scaling_registry()))
def test_cached_decoding_equals_the_full_forward_for_every_rope_scaling(method: str) -> None:
    scaling = RopeScalingConfig(method=method, factor=2.0, original_length=TRAIN_LENGTH)
    # LongRoPE's short/long switch is exact too (keys are re-rotated at each forward's length); dynamic NTK only up
    # to the original length (the cache keeps earlier tokens' states: posenc_cli/kv_cache.py's docstring)
    T = TRAIN_LENGTH if method == "dynamic" else 2 * TRAIN_LENGTH
    check(make(RopeConfig(scaling=scaling)), T)


@pytest.mark.parametrize(
    "remap",
    [
        RemapConfig(method="self-extend", window=4, group=3),
        RemapConfig(method="rerope", window=5),
        RemapConfig(method="rerope", window=5, leaky=4.0),
    ],
    ids=lambda r: r.describe(),
)
def test_cached_decoding_equals_the_full_forward_for_the_remaps(remap: RemapConfig) -> None:
    check(make(RopeConfig(remap=remap)), 28)


@pytest.mark.parametrize("scale", ["logn", "ssmax"])
@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_cached_decoding_equals_the_full_forward_with_attention_scaling(scale: str, name: str) -> None:
    model_cfg = dataclasses.replace(TINY, attn_scale=scale, logn_length=8)
    check(make(config_class(name)(), model_cfg), 24)


def test_prefill_alone_is_the_full_forward_and_fills_every_layer() -> None:
    model = make(RopeConfig())
    cache = model.new_cache()
    idx = tokens(2, 10)
    with torch.no_grad():
        torch.testing.assert_close(model(idx, cache=cache), full(model, idx), atol=ATOL, rtol=0)
    assert cache.length == 10
    assert all(k is not None and k.shape == (2, 2, 10, 16) for k in cache.keys)


def test_a_length_the_scheme_refuses_leaves_the_cache_unchanged() -> None:
    from posenc_cli.errors import LengthBeyondScheme

    model = make(config_class("learned")())
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens(1, TRAIN_LENGTH), cache=cache)
        with pytest.raises(LengthBeyondScheme):
            model(tokens(1, 1), cache=cache)
    assert cache.length == TRAIN_LENGTH


def test_a_cache_with_explicit_ids_needs_the_new_tokens_ids() -> None:
    model = make(RopeConfig())
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens(1, 4), cache=cache, position_ids=torch.tensor([0, 3, 5, 9]))
        with pytest.raises(ValueError, match="position_ids"):
            model(tokens(1, 1), cache=cache)


def test_the_cache_refuses_training_mode() -> None:
    model = make(RopeConfig()).train()
    with pytest.raises(RuntimeError, match="eval"):
        model(tokens(1, 4), cache=model.new_cache())


def test_evict_keeps_the_chosen_tokens_as_computed_and_repositions_them() -> None:
    cache = KVCache(2)
    k = torch.arange(10.0).view(1, 1, 10, 1)
    for layer in range(2):
        cache.append(layer, k, -k)
    cache.ids = torch.arange(10) * 3
    cache.keep_sinks_and_recent(2, 3)
    assert cache.length == 5 and cache.ids is None
    for layer in range(2):
        assert cache.keys[layer].flatten().tolist() == [0, 1, 7, 8, 9]
        assert cache.values[layer].flatten().tolist() == [0, -1, -7, -8, -9]
    cache.keep_sinks_and_recent(2, 3)  # already within the budget: unchanged
    assert cache.length == 5


def test_evicted_cache_decodes_as_a_fresh_forward_over_the_kept_tokens_for_one_layer() -> None:
    """With one layer the cached K/V of a token equal what a fresh forward over the kept tokens computes (keys are
    unrotated, re-rotated at their in-cache positions), so both agree: StreamingLLM's cache and re-computation differ
    only from layer 2 on (tests/evaluation/test_streaming.py)."""
    model = make(RopeConfig(), dataclasses.replace(TINY, n_layer=1))
    idx = tokens(1, 12)
    cache = model.new_cache()
    with torch.no_grad():
        model(idx[:, :10], cache=cache)
        cache.keep_sinks_and_recent(2, 4)  # tokens 0, 1, 6, 7, 8, 9 at positions 0..5
        step = model(idx[:, 10:11], cache=cache)[:, -1]
        kept = torch.cat([idx[:, :2], idx[:, 6:11]], dim=1)
        torch.testing.assert_close(step, full(model, kept)[:, -1], atol=ATOL, rtol=0)


def _rotations(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of RoPE's whole-key rotations (rotate, rotate_rows) and new-row rotations (rotate_new)."""
    from posenc_cli.positional import rope

    counts = {"all keys": 0, "new rows": 0}
    for name, kind in (("rotate", "all keys"), ("rotate_rows", "all keys"), ("rotate_new", "new rows")):
        inner = getattr(rope.RoPE, name)

        def counted(self, *args, _inner=inner, _kind=kind):  # type: ignore[no-untyped-def]
            counts[_kind] += 1
            return _inner(self, *args)

        monkeypatch.setattr(rope.RoPE, name, counted)
    return counts


def test_rope_keys_are_rotated_once_and_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 2 of issue #42: after the prompt each forward rotates its new rows alone; the kept rotated keys equal
    the unrotated ones turned at their positions (the full forward's logits: the contract tests above)."""
    model = make(RopeConfig())
    counts = _rotations(monkeypatch)
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens(2, 8), cache=cache)
        for t in range(3):
            model(tokens(2, 1, seed=t + 1), cache=cache)
    assert counts == {"all keys": TINY.n_layer, "new rows": 3 * TINY.n_layer}
    assert all(k is not None and k.shape[2] == 11 for k in cache.rotated)


def test_length_dependent_scaling_and_eviction_rotate_every_key_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamic NTK's frequencies follow the length: every key turns again at each forward. After `evict` the kept
    tokens take new positions: the next forward turns them all once, later ones only their new rows."""
    dynamic = RopeConfig(scaling=RopeScalingConfig(method="dynamic", factor=2.0))
    model = make(dynamic)
    counts = _rotations(monkeypatch)
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens(1, 20), cache=cache)
        model(tokens(1, 1), cache=cache)
    assert counts == {"all keys": 2 * TINY.n_layer, "new rows": 0}
    model = make(RopeConfig())
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens(1, 10), cache=cache)
        cache.keep_sinks_and_recent(2, 4)
        model(tokens(1, 1), cache=cache)
        model(tokens(1, 1, seed=2), cache=cache)
    assert counts == {"all keys": 2 * TINY.n_layer + 2 * TINY.n_layer, "new rows": TINY.n_layer}


def test_a_step_writes_its_rows_into_room_held_for_the_cell() -> None:
    """Keys, values and rotated keys are views of buffers sized for the cell: steps add rows in place (no copy of
    the held ones), and a cache past its room or after `evict` moves to a new buffer with the same contents."""
    model = make(RopeConfig())
    cache = model.new_cache(cell_length=10)
    with torch.no_grad():
        model(tokens(2, 8), cache=cache)
        where = [t.data_ptr() for t in (*cache.keys, *cache.values, *cache.rotated)]
        model(tokens(2, 2, seed=1), cache=cache)
        assert [t.data_ptr() for t in (*cache.keys, *cache.values, *cache.rotated)] == where
        held = cache.keys[0].clone()
        model(tokens(2, 1, seed=2), cache=cache)  # past the cell's 10 tokens
    assert cache.length == 11 and torch.equal(cache.keys[0][:, :, :10], held)
