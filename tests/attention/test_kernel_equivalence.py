"""Behaviour unchanged: for every registered scheme (and the remaps, the length scalings, dropout), the model through
the chosen kernels gives bit-identical logits, losses and gradients to the same model through the attention code
as it was before the kernels (`legacy_attention.py`, frozen): fp32 and bf16 autocast, default, shared and per-row
position ids, non-causal, forced chunks, KV-cache decoding, and training steps (the fp32 road of bf16 training, the
key-bias road with gradients, dropout's random draws)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from attention_utils import force_chunks
from legacy_attention import legacy_forward
from scheme_utils import plain_schemes

from posenc_cli.attention import CausalSelfAttention
from posenc_cli.config import ModelConfig, PosConfig, RemapConfig
from posenc_cli.model import GPT
from posenc_cli.positional import config_class, registry, scheme_class
from posenc_cli.positional.rope import RopeConfig
from posenc_cli.rope_scaling import RopeScalingConfig

VOCAB, TRAIN_LENGTH = 48, 16
TINY = ModelConfig(d_model=32, n_layer=2, n_head=2)
LEGACY_HOOKS = {"embed", "rotate", "bias"}  # the hooks the frozen attention called


def cases() -> Iterator[tuple[str, PosConfig, ModelConfig]]:
    for name in plain_schemes():  # the frozen attention knew no spans; hybrids: tests/positional/test_layout.py
        if set(scheme_class(name).hooks) <= LEGACY_HOOKS:  # content, logits, normalise came later (test_scored.py)
            yield name, config_class(name)(), TINY
    for remap in (RemapConfig(method="self-extend", window=4, group=3), RemapConfig(method="rerope", window=5)):
        yield f"rope-{remap.describe()}", RopeConfig(remap=remap), TINY
    yield "rope-interleaved-half", RopeConfig(layout="interleaved", rotary_fraction=0.5), TINY
    yield "p-rope", RopeConfig(p=0.5), TINY
    yield "rope-yarn", RopeConfig(scaling=RopeScalingConfig(method="yarn", factor=2.0, original_length=8)), TINY
    for scale in ("logn", "ssmax"):
        for name in ("rope", "alibi"):
            yield f"{name}-{scale}", config_class(name)(), dataclasses.replace(TINY, attn_scale=scale, logn_length=8)
    for name in ("alibi", "nope", "t5"):
        yield f"{name}-dropout", config_class(name)(), dataclasses.replace(TINY, dropout=0.1)


CASES = {name: (pos, model) for name, pos, model in cases()}


def build(pos: PosConfig, model: ModelConfig) -> GPT:
    """Seeded; zero-initialised scheme parameters (CoPE's e) drawn so that the scheme acts."""
    torch.manual_seed(0)
    gpt = GPT(model, pos, VOCAB, TRAIN_LENGTH)
    with torch.no_grad():
        for p in gpt.scheme.parameters():
            if not p.any():
                p.normal_(std=0.5)
    return gpt


def outputs(pos: PosConfig, model_cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Everything the roads produce for one scheme, keyed by what was run."""
    out: dict[str, torch.Tensor] = {}
    extrapolates = registry()[pos.name].extrapolates
    T = 28 if extrapolates else TRAIN_LENGTH
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(0))
    span = 2 * T if extrapolates else TRAIN_LENGTH
    ids = torch.sort(torch.randperm(span, generator=torch.Generator().manual_seed(1))[:T]).values
    model = build(pos, model_cfg).eval()
    bf16 = torch.autocast("cpu", dtype=torch.bfloat16)
    with torch.no_grad():
        out["fp32"] = model(idx)
        out["ids"] = model(idx, position_ids=ids)
        out["row-ids"] = model(idx, position_ids=torch.stack([ids, torch.arange(T)]))  # (B, T) ids
        if not model.scheme.causal_only:  # the others refuse it (test_scheme_contract)
            out["non-causal"] = model(idx, causal=False)
        with bf16:
            out["bf16"] = model(idx)
            out["bf16-ids"] = model(idx, position_ids=ids)
        force_chunks(model, 5)
        out["chunk"] = model(idx)
        with bf16:
            out["bf16-chunk"] = model(idx)
        force_chunks(model, None)
        row_ids = torch.stack([ids, torch.arange(T)])  # (B, T): one row of ids per sequence
        for precision in ("fp32", "bf16"):
            for label, piece_ids in (("default", None), ("ids", ids), ("row-ids", row_ids)):
                cache, pieces, start = model.new_cache(), [], 0
                for n in [T // 2, 3] + [1] * (T - T // 2 - 3):
                    given = None if piece_ids is None else piece_ids[..., start : start + n]
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                        pieces.append(model(idx[:, start : start + n], cache=cache, position_ids=given))
                    start += n
                out[f"cache-{precision}-{label}"] = torch.cat(pieces, 1)
    data = torch.randint(0, VOCAB, (2, TRAIN_LENGTH + 1), generator=torch.Generator().manual_seed(2))
    for precision in ("fp32", "bf16"):
        model = build(pos, model_cfg).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                logits = model(data[:, :-1]).float()
            loss = F.cross_entropy(logits.flatten(0, 1), data[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        out[f"train-{precision}-loss"] = torch.stack(losses)
        out[f"train-{precision}-grad"] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernels_equal_the_frozen_attention_bit_for_bit(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pos, model_cfg = CASES[case]
    new = outputs(pos, model_cfg)  # seeded: the same weights and dropout draws both times
    monkeypatch.setattr(CausalSelfAttention, "forward", legacy_forward)
    old = outputs(pos, model_cfg)
    assert new.keys() == old.keys()
    differ = [key for key in new if not torch.equal(new[key], old[key])]
    assert not differ, f"{case}: {differ} differ from the frozen attention"
