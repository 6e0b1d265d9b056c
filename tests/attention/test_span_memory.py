"""Memory linear in length on every road of a windowed, chunked or packed (document) layer: at T = 512 with the
chunk budget (`choose.BIAS_CHUNK_BYTES`) shrunk to 16 KiB, so that a budget-sized chunk is far from T×T, no torch
operation of a forward allocates T² bytes (a quarter of one fp32 T×T score matrix per head). FlexAttention's block
mask, the one builder that did (issue #40), is held in tests/attention/test_flex.py."""

from __future__ import annotations

import pytest
import torch
from attention_utils import LargestAllocation

from posenc_cli.attention import AttentionState, attend, choose, choose_kernel, describe
from posenc_cli.config import ModelConfig
from posenc_cli.positional import PositionContext, build_scheme, config_class
from posenc_cli.positional.base import Documents
from posenc_cli.positional.span import FULL, Span

T = 512
MODEL = ModelConfig(d_model=32, n_layer=2, n_head=2)
SPANS = {"sliding": Span("sliding", 48), "chunked": Span("chunked", 48), "full": FULL}
# (span, packed rows): full causal attention over one sequence hides nothing, so it is not a case here
CASES = [(span, documents) for span in sorted(SPANS) for documents in (False, True) if span != "full" or documents]


@pytest.mark.parametrize(("span", "documents"), CASES, ids=[f"{s}{' packed' if d else ''}" for s, d in CASES])
@pytest.mark.parametrize("name", ["nope", "alibi", "t5", "stickbreaking"])
def test_no_road_allocates_t_squared(name: str, span: str, documents: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choose, "BIAS_CHUNK_BYTES", 2**14)
    torch.manual_seed(0)
    scheme = build_scheme(config_class(name)(), MODEL, 16)
    ids = torch.arange(T)[None] // 150 if documents else None  # documents of 150 tokens
    ctx = PositionContext(positions=torch.arange(T), documents=None if ids is None else Documents.from_ids(ids))
    scheme.prepare(ctx)
    q, k, v = (torch.randn(1, MODEL.n_head, T, MODEL.head_dim) for _ in range(3))
    state = AttentionState(scheme, ctx)
    with torch.no_grad(), LargestAllocation() as seen:
        out = attend(q, k, v, scheme, 0, ctx, state=state, span=SPANS[span])
    kernel = choose_kernel(describe(state, q, span=SPANS[span]))
    assert out.shape == q.shape and torch.isfinite(out).all()
    assert seen.nbytes < T * T, (kernel, seen.shape)
