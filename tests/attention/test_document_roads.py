"""Packed rows on every attention road: the kernel choice's document rules, and per road (forced as the other
attention tests force them) that a packed row gives each document the logits it gets alone from position 0."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from attention_utils import force_chunks

from posenc_cli.attention import KernelSpec, choose, choose_kernel, flex
from posenc_cli.attention.flex import Flex
from posenc_cli.attention.kernels import (
    ChunkedBias,
    Fused,
    InFp32,
    Kernel,
    KeyBias,
    Masked,
    Remapped,
    SharedMask,
)
from posenc_cli.attention.scored import Scored
from posenc_cli.attention.windowed import BlockCausal, Windowed
from posenc_cli.config import ModelConfig, PosConfig, RemapConfig
from posenc_cli.model import GPT
from posenc_cli.positional import config_class
from posenc_cli.positional.base import Documents
from posenc_cli.positional.layout import LayoutConfig
from posenc_cli.positional.rope import RopeConfig
from posenc_cli.positional.span import Span

TINY = ModelConfig(d_model=32, n_layer=2, n_head=2)
VOCAB = 48
LENGTHS = (6, 9, 2)  # and two pads: 19 tokens
CHUNK = choose.DOCUMENT_CHUNK
WINDOW_CHUNK = Span("sliding", 8).queries_per_chunk(choose.BIAS_CHUNK_BYTES // 4)  # B = H = 1


def spec(**kw: object) -> KernelSpec:
    return KernelSpec(dtype=torch.float32, device="cpu", seq_len=64, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("facts", "plain", "packed"),
    [
        ({"has_bias": False}, Fused(), Masked(CHUNK)),
        ({"has_bias": False, "causal": False}, Fused(causal=False), Masked(CHUNK, causal=False)),
        ({"has_bias": False, "span": Span("chunked", 8)}, BlockCausal(8), Windowed(Span("chunked", 8), WINDOW_CHUNK)),
        ({"has_bias": False, "span": Span("sliding", 8)}, *[Windowed(Span("sliding", 8), WINDOW_CHUNK)] * 2),
        ({"has_bias": True, "bias_shared": True, "offers_key_bias": True}, KeyBias(), KeyBias(chunk=CHUNK)),
        ({"has_bias": True, "bias_shared": True}, SharedMask(), SharedMask()),
        ({"has_bias": True, "chunk_size": 5}, ChunkedBias(5), ChunkedBias(5)),
    ],
    ids=["fused", "non-causal", "chunked span", "sliding span", "key bias", "shared mask", "chunked bias"],
)
def test_the_document_rules(facts: dict, plain: Kernel, packed: Kernel) -> None:
    """`Fused` and `BlockCausal` cannot hide other documents: packed rows take `Masked` and `Windowed`; `KeyBias`
    attends by the same query chunks as `Masked`; every other road takes the documents itself."""
    assert choose_kernel(spec(**facts)) == plain
    assert choose_kernel(spec(**facts, documents=True)) == packed


def test_documents_are_runs_and_each_pad_is_its_own() -> None:
    docs = Documents.from_ids(torch.tensor([[-1, -1, 3, 3, 3, 0, 0, -1, -1], [5, 5, 5, 5, 2, 5, 5, -1, 7]]))
    assert docs.segment.tolist() == [[0, 1, 2, 2, 2, 3, 3, 4, 5], [0, 0, 0, 0, 1, 2, 2, 3, 4]]
    assert docs.local.tolist() == [[0, 0, 0, 1, 2, 0, 1, 0, 0], [0, 1, 2, 3, 0, 0, 1, 0, 0]]
    pos = torch.arange(9)
    seen = docs.visible(pos, pos, Span("chunked", 2))[1, 0]  # chunks from each document's first token
    assert seen[3].tolist() == [False, False, True, True, False, False, False, False, False]


def layout(entry: dict) -> LayoutConfig:
    return LayoutConfig(layers=[entry])


FLEX = {"FLEX_MIN_LEN": {("cpu", torch.float32): 0}, "KEY_BIAS_DEVICES": ()}
# road -> (scheme config, forced settings of `choose`, queries per chunk forced, the kernel class expected)
ROADS: dict[str, tuple[PosConfig, dict, int | None, type]] = {
    "masked": (RopeConfig(), {}, None, Masked),
    "masked-chunks": (RopeConfig(), {"DOCUMENT_CHUNK": 4}, None, Masked),  # chunks of queries skip earlier documents
    "key-bias": (config_class("alibi")(), {}, None, KeyBias),
    "key-bias-chunks": (config_class("alibi")(), {"DOCUMENT_CHUNK": 5}, None, KeyBias),
    "shared-mask": (config_class("alibi")(), {"KEY_BIAS_DEVICES": ()}, None, SharedMask),
    "chunked-bias": (config_class("t5")(), {}, 5, ChunkedBias),
    "remapped": (RopeConfig(remap=RemapConfig(method="self-extend", window=3, group=2)), {}, None, Remapped),
    "scored": (config_class("stickbreaking")(), {}, 5, Scored),
    "scored-logits": (config_class("path")(), {}, 5, Scored),
    "windowed-chunks": (layout({"name": "rope", "span": "chunked", "window": 4}), {}, None, Windowed),
    "windowed-bias": (layout({"name": "fire", "span": "sliding", "window": 3}), {}, 4, Windowed),
    "flex": (config_class("alibi")(), FLEX, None, Flex),
    "flex-span": (layout({"name": "t5", "span": "chunked", "window": 4}), FLEX, None, Flex),
}


def chosen(monkeypatch: pytest.MonkeyPatch) -> list[Kernel]:
    """Every kernel `choose_kernel` returns from now on (`choose.forward_kernel` looks it up in `choose`)."""
    seen: list[Kernel] = []
    original: Callable[[KernelSpec], Kernel] = choose.choose_kernel

    def spy(s: KernelSpec) -> Kernel:
        seen.append(original(s))
        return seen[-1]

    monkeypatch.setattr(choose, "choose_kernel", spy)
    return seen


def packed_row(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[int, torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(0, VOCAB, (n,), generator=g) for n in LENGTHS]
    idx = torch.cat([*docs, torch.tensor([1, 2])])[None]  # (1, T)
    ids = torch.cat([*(torch.arange(n) for n in LENGTHS), torch.zeros(2, dtype=torch.long)])[None]
    documents = torch.cat([*(torch.full((n,), i) for i, n in enumerate(LENGTHS)), torch.tensor([-1, -1])])[None]
    starts = torch.tensor((0, *LENGTHS)).cumsum(0).tolist()
    return idx, ids, documents, list(zip(starts, docs, strict=False))


@pytest.mark.parametrize("road", sorted(ROADS))
def test_each_road_gives_each_document_its_logits_alone(road: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pos, forced, chunk, expected = ROADS[road]
    torch.manual_seed(0)
    model = GPT(TINY, pos, VOCAB, 16).eval()
    with torch.no_grad():
        for p in model.scheme.parameters():
            p.normal_(std=0.5)  # so that every scheme acts (CoPE-like zero inits, FIRE's MLP, ...)
    force_chunks(model, chunk)
    for key, value in forced.items():
        monkeypatch.setattr(choose, key, value)
    monkeypatch.setattr(flex, "COMPILE", False)  # FlexAttention's eager reference at these lengths
    idx, ids, documents, docs = packed_row()
    kernels = chosen(monkeypatch)
    with torch.no_grad():
        out = model(idx, position_ids=ids, documents=documents)[0]
        assert any(isinstance(k, expected) for k in kernels), kernels
        for start, x in docs:
            torch.testing.assert_close(out[start : start + len(x)], model(x[None])[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["rope", "alibi", "stickbreaking"])
def test_bf16_training_attends_in_fp32_within_documents(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 autocast with gradients on CPU: `InFp32` around the document road, each document as alone (bf16)."""
    torch.manual_seed(0)
    model = GPT(TINY, config_class(name)(), VOCAB, 16)
    idx, ids, documents, docs = packed_row(seed=1)
    kernels = chosen(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(idx, position_ids=ids, documents=documents)[0]
        assert any(isinstance(k, InFp32) for k in kernels), kernels
        for start, x in docs:
            alone = model(x[None])[0]
            torch.testing.assert_close(out[start : start + len(x)].float(), alone.float(), rtol=0, atol=0.02)
    out.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
