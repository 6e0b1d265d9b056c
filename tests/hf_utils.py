"""Tiny random `transformers` models saved with a tiny byte-level BPE tokenizer, for the hf_* tests (no network)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

LINES = [
    "the quick brown fox jumps over the lazy dog",
    "seven wizards quietly judge boxing matches near old river banks",
    "bright stars fall into deep blue water under cold winter skies — naïve café",
]
EOS = "<|endoftext|>"


def tiny_tokenizer() -> Any:
    """A byte-level BPE (about 300 ids) trained on three lines, as a `PreTrainedTokenizerFast` with EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(LINES * 10, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)


def tiny_config(arch: str, vocab: int, max_pos: int = 32, **extra: Any) -> Any:
    """A 2-layer, d = 32 config of `arch` (llama, gpt_neox, gpt2, qwen2, bert)."""
    import transformers as tf

    common = {"vocab_size": vocab, "bos_token_id": 0, "eos_token_id": 0, **extra}
    if arch == "gpt2":
        return tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=max_pos, **common)
    sizes = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    if arch == "llama":
        return tf.LlamaConfig(**sizes, num_key_value_heads=2, max_position_embeddings=max_pos, **common)
    if arch == "qwen2":
        return tf.Qwen2Config(**sizes, num_key_value_heads=2, max_position_embeddings=max_pos, **common)
    if arch == "gpt_neox":
        return tf.GPTNeoXConfig(**sizes, max_position_embeddings=max_pos, rotary_pct=0.5, **common)
    if arch == "bert":
        return tf.BertConfig(**sizes, **common)
    raise ValueError(arch)


def save_tiny_model(directory: Path, arch: str, *, seed: int = 0, tokenizer: bool = True, **extra: Any) -> Path:
    """Random weights of a tiny `arch` model plus (unless told not to) the tiny tokenizer, into `directory`."""
    import transformers as tf

    tok = tiny_tokenizer()
    cfg = tiny_config(arch, len(tok), **extra)
    torch.manual_seed(seed)
    model = tf.BertForMaskedLM(cfg) if arch == "bert" else tf.AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(str(directory))
    if tokenizer:
        tok.save_pretrained(str(directory))
    return Path(directory)


def write_text_corpus(directory: Path, lines: int = 400) -> Path:
    """A small text file mixing the tokenizer's lines (for data=text evaluation)."""
    path = Path(directory) / "corpus.txt"
    path.write_text("\n".join(f"{i} {LINES[i % len(LINES)]}" for i in range(lines)) + "\n")
    return path
