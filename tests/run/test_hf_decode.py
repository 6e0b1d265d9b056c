"""Greedy decoding of `transformers` checkpoints through their own KV cache (`HFCausalLM.decode_step`): the same
tokens as the full forward per generated token, in fp32, on a tiny model of each supported architecture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_layer_utils import LAYERED, save_layered_model
from hf_utils import save_tiny_model
from torch import Tensor, nn

pytest.importorskip("transformers")

from posenc_cli.evaluation.passkey import greedy_decode
from posenc_cli.run.hf_run import HFCausalLM, cache_refusal, load_hf_run

PLAIN = ("llama", "qwen2", "gpt_neox", "gpt2")


class FullForward(nn.Module):
    """The checkpoint without `decode_step`: `greedy_decode` then runs a full forward per generated token."""

    def __init__(self, model: HFCausalLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: Tensor, position_ids: Tensor | None = None) -> Tensor:
        return self.model(idx, position_ids=position_ids)


class Counting(nn.Module):
    """Counts the full forwards and cached steps a decode takes."""

    def __init__(self, model: HFCausalLM) -> None:
        super().__init__()
        self.model, self.full, self.steps = model, 0, 0

    def forward(self, idx: Tensor, position_ids: Tensor | None = None) -> Tensor:
        self.full += 1
        return self.model(idx, position_ids=position_ids)

    def uncached_reason(self) -> str | None:
        return self.model.uncached_reason()

    def decode_step(
        self, idx: Tensor, past: object = None, position_ids: Tensor | None = None
    ) -> tuple[Tensor, object]:
        self.steps += 1
        return self.model.decode_step(idx, past, position_ids=position_ids)


def _bloom(directory: Path) -> Path:
    """A tiny BLOOM (ALiBi) with the tiny tokenizer."""
    import transformers as tf
    from hf_utils import tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = tf.BloomConfig(vocab_size=len(tok), hidden_size=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(str(directory))
    tok.save_pretrained(str(directory))
    return directory


def _saved(tmp_path: Path, arch: str, **extra: object) -> Path:
    if arch == "bloom":
        return _bloom(tmp_path / arch)
    if arch in PLAIN:
        return save_tiny_model(tmp_path / arch, arch, **extra)
    return save_layered_model(tmp_path / arch, arch, **extra)


def _prompts(vocab: int, batch: int = 3, length: int = 13) -> Tensor:
    return torch.randint(1, vocab, (batch, length), generator=torch.Generator().manual_seed(1))  # (B, P)


@pytest.mark.parametrize("arch", [*PLAIN, "bloom", *LAYERED])
def test_cached_decode_gives_the_full_forward_tokens(tmp_path: Path, arch: str) -> None:
    """Prompts longer than the layered models' windows and chunks (8), decoded past them."""
    model = load_hf_run(_saved(tmp_path, arch), train_length=32).model  # (BLOOM's config names no length)
    counted = Counting(model)
    prompts = _prompts(model.hf.config.vocab_size)
    with torch.inference_mode():
        cached = greedy_decode(counted, prompts, 12)
        full = greedy_decode(FullForward(model), prompts, 12)
    assert (counted.steps, counted.full) == (12, 0)  # the cache served every step
    assert torch.equal(cached, full)


def test_position_ids_reach_both_paths(tmp_path: Path) -> None:
    """Given ids (B, P + steps), each forward reads its tokens' ids: the cached and full paths agree, and the ids
    change the tokens (so they were read)."""
    model = load_hf_run(_saved(tmp_path, "llama", initializer_range=0.5)).model  # weights that read positions
    prompts = _prompts(model.hf.config.vocab_size, length=6)
    ids = (torch.arange(6 + 8) * 2 + 1).expand(3, -1)  # (B, P + steps): spread ids
    with torch.inference_mode():
        cached = greedy_decode(model, prompts, 8, position_ids=ids)
        full = greedy_decode(FullForward(model), prompts, 8, position_ids=ids)
        plain = greedy_decode(model, prompts, 8)
    assert torch.equal(cached, full)
    assert not torch.equal(cached, plain)


def test_length_dependent_rope_decodes_by_full_forwards(tmp_path: Path) -> None:
    """Dynamic NTK re-rotates every key as the length grows: such a checkpoint keeps the full forward per token."""
    rope = {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10_000.0}
    model = load_hf_run(_saved(tmp_path, "llama", rope_parameters=rope)).model
    assert "dynamic" in (model.uncached_reason() or "")
    counted = Counting(model)
    with torch.inference_mode():
        greedy_decode(counted, _prompts(model.hf.config.vocab_size, length=30), 6)
    assert (counted.steps, counted.full) == (0, 6)


def test_cache_refusal_names_the_length_dependent_types() -> None:
    assert cache_refusal({"default"}) is None
    assert cache_refusal({"yarn", "linear", "llama3"}) is None
    assert "longrope" in (cache_refusal({"default", "longrope"}) or "")
