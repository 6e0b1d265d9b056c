"""Packed rows (`GPT.forward(documents=)`), parametrised over the registry as the scheme contract is: several
documents in one row, each with position ids from 0, give every real token the logits (fp32, 1e-5) and the gradients
that the same documents get alone, one per row from position 0; pads anywhere in a row change no real token's logits;
`documents=None` is today's forward, and one document over the whole row is too.

The packed rows hold documents longer than the hybrids' windows (4 tokens at this training length), so sliding and
chunked spans hide keys within a document, and PaTH's convolution, FoX's and CoPE's sums and stick-breaking's breaks
all run across a document boundary unless the document mask and restart keep them apart.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attention_utils import force_chunks
from scheme_utils import lively, n_layer_for

from posenc_cli.config import ModelConfig
from posenc_cli.model import GPT
from posenc_cli.positional import config_class, registry

SCHEMES = sorted(registry())
TINY = ModelConfig(d_model=32, n_layer=2, n_head=2)
VOCAB = 48
TRAIN_LENGTH = 16
PAD = -1  # the document id of a pad
# two rows: (document lengths, pads after each document) -> 17 tokens each, pads between, before and after documents
ROWS = (((5, 7, 3), (0, 0, 2)), ((9, 4), (1, 3)))


def make(name: str) -> GPT:
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(TINY, n_layer=n_layer_for(name)), config_class(name)(), VOCAB, TRAIN_LENGTH)
    return lively(model)


def packed(seed: int = 0, leading_pads: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]:
    """(idx, documents, position ids), each (B, T), and per row the (start, tokens) of its documents."""
    g = torch.Generator().manual_seed(seed)
    rows, docs, ids, spans = [], [], [], []
    for lengths, pads in ROWS:
        toks, doc, pos, where = [], [], [], []
        n = leading_pads
        toks.append(torch.full((n,), 7))  # drawn from no generator: the documents stay the same
        doc.append(torch.full((n,), PAD))
        pos.append(torch.zeros(n, dtype=torch.long))
        for d, (length, pad) in enumerate(zip(lengths, pads, strict=True)):
            x = torch.randint(0, VOCAB, (length,), generator=g)
            where.append((n, x))
            toks += [x, torch.randint(0, VOCAB, (pad,), generator=g)]  # pads hold arbitrary tokens
            doc += [torch.full((length,), d), torch.full((pad,), PAD)]
            pos += [torch.arange(length), torch.zeros(pad, dtype=torch.long)]
            n += length + pad
        rows.append(torch.cat(toks))
        docs.append(torch.cat(doc))
        ids.append(torch.cat(pos))
        spans.append(where)
    return torch.stack(rows), torch.stack(docs), torch.stack(ids), spans


@pytest.mark.parametrize("name", SCHEMES)
def test_each_packed_document_gets_its_logits_alone(name: str) -> None:
    model = make(name)
    idx, docs, ids, spans = packed()
    with torch.no_grad():
        out = model(idx, position_ids=ids, documents=docs)  # (B, T, V)
        assert torch.isfinite(out).all()  # pads too: no softmax row is empty
        for b, where in enumerate(spans):
            for start, x in where:
                alone = model(x[None])[0]  # (n, V), position ids 0..n−1
                torch.testing.assert_close(out[b, start : start + len(x)], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", SCHEMES)
def test_each_packed_document_gets_its_logits_alone_in_chunks_of_queries(name: str) -> None:
    """Queries forced into chunks of 5 (the bias and scored roads then skip the keys of earlier documents)."""
    model = make(name)
    idx, docs, ids, spans = packed(seed=4)
    with torch.no_grad():
        alone = [[model(x[None])[0] for _, x in where] for where in spans]
        force_chunks(model, 5)
        out = model(idx, position_ids=ids, documents=docs)
    for b, where in enumerate(spans):
        for (start, x), ref in zip(where, alone[b], strict=True):
            torch.testing.assert_close(out[b, start : start + len(x)], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", SCHEMES)
def test_gradients_of_packed_documents_are_the_sum_of_theirs_alone(name: str) -> None:
    """A weighted sum of the real tokens' logits: every parameter's gradient equals the sum over the documents run
    alone, so nothing flows across a document boundary or from a pad."""
    model = make(name)
    idx, docs, ids, spans = packed(seed=1)
    g = torch.Generator().manual_seed(2)
    weights = torch.randn(*idx.shape, VOCAB, generator=g)
    out = model(idx, position_ids=ids, documents=docs)
    total = sum((out[b, s : s + len(x)] * weights[b, s : s + len(x)]).sum() for b, w in enumerate(spans) for s, x in w)
    params = [p for p in model.parameters() if p.requires_grad]
    packed_grads = torch.autograd.grad(total, params, allow_unused=True)
    alone_total = sum((model(x[None])[0] * weights[b, s : s + len(x)]).sum() for b, w in enumerate(spans) for s, x in w)
    alone_grads = torch.autograd.grad(alone_total, params, allow_unused=True)
    for (pname, _), a, r in zip(model.named_parameters(), packed_grads, alone_grads, strict=True):
        assert (a is None) == (r is None), pname
        if a is not None:
            torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-5, msg=lambda m, p=pname: f"{name} {p}: {m}")


@pytest.mark.parametrize("name", SCHEMES)
def test_pads_before_and_between_documents_change_no_real_logit(name: str) -> None:
    """Leading pads (a left-padded row) and other pad tokens: the real tokens' logits are those without them."""
    model = make(name)
    with torch.no_grad():
        idx, docs, ids, spans = packed(seed=3)
        ref = model(idx, position_ids=ids, documents=docs)
        lead = 3
        idx2, docs2, ids2, spans2 = packed(seed=3, leading_pads=lead)
        idx2 = torch.where(docs2 == PAD, (idx2 + 5) % VOCAB, idx2)  # other pad tokens
        out = model(idx2, position_ids=ids2, documents=docs2)
        for b, (where, where2) in enumerate(zip(spans, spans2, strict=True)):
            for (s, x), (s2, x2) in zip(where, where2, strict=True):
                assert torch.equal(x, x2) and s2 == s + lead
                torch.testing.assert_close(out[b, s2 : s2 + len(x)], ref[b, s : s + len(x)], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", SCHEMES)
def test_one_document_over_the_row_is_the_plain_forward(name: str) -> None:
    """`documents=None` is today's forward bit for bit; one document over the whole row takes the document roads
    and gives the same logits (to rounding)."""
    model = make(name)
    idx = packed()[0][:, :TRAIN_LENGTH]  # within a learned table
    with torch.no_grad():
        ref = model(idx)
        assert torch.equal(model(idx, documents=None), ref)
        one = model(idx, documents=torch.zeros_like(idx))  # position ids: 0..T−1, each row's index
        torch.testing.assert_close(one, ref, rtol=1e-5, atol=1e-5)
