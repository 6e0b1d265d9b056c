"""Greedy decoding speed: posenc's decoders against `transformers`' own `generate`, side by side (issue #42).

    python benchmarks/decode_speed.py                      # 512 and 2,048 prompt tokens, 32 new, 1 thread, fp32
    python benchmarks/decode_speed.py --lengths 512 2048 8192 --rounds 3

Two pairs, each timed alternately in one process (best of `--rounds`), with the same random prompts:

- posenc: a RoPE run (d = 256, 6 layers, 4 heads, byte tokens; trained for one step, so the weights are posenc's
  initialisation) decoded by `evaluation.passkey.greedy_decode` (posenc's KV cache) against `generate` on the same
  run exported with `posenc export` (GPT-NeoX in `transformers`);
- transformers: a Llama-shaped checkpoint of the same size (random weights) decoded by `greedy_decode` through
  `run.hf_run.HFCausalLM` (its own KV cache; and, up to `--full-cap` tokens, the full forward per token that
  decoded such checkpoints before) against `generate`.

Batch: 4 prompts at 512 tokens, 2 at 2,048, 1 beyond. It prints tokens generated per second for each decoder, the
ratio to `generate` (> 1: faster than generate), and whether the tokens are the same.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from posenc_cli.evaluation.passkey import greedy_decode
from posenc_cli.run.config_load import config_from_dict
from posenc_cli.run.export import export_run
from posenc_cli.run.hf_run import HFCausalLM, HFScheme
from posenc_cli.run.load import load_run
from posenc_cli.run.train import train

D_MODEL, N_LAYER, N_HEAD, FFN = 256, 6, 4, 1024
Decoder = Callable[[Tensor, int], Tensor]  # (prompts (B, P), steps) -> (B, steps)


class FullForward(nn.Module):
    """A checkpoint without `decode_step`: `greedy_decode` runs a full forward per generated token (the old path)."""

    def __init__(self, model: HFCausalLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: Tensor) -> Tensor:
        return self.model(idx)


def posenc_run(root: Path) -> Path:
    """A RoPE run of one training step (fp32, 1 thread) on a small text file: posenc's initial weights, saved."""
    corpus = root / "corpus.txt"
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "light", "cloud", "seven", "north"]
    corpus.write_text("\n".join(" ".join(rng.choice(words, 12)) for _ in range(600)) + "\n")
    cfg = config_from_dict(
        {
            "model": {"d_model": D_MODEL, "n_layer": N_LAYER, "n_head": N_HEAD},
            "pos": {"name": "rope"},
            "data": {"source": "text", "paths": [str(corpus)], "val_fraction": 0.1},
            "train": {"seq_len": 64, "batch_size": 2, "steps": 1, "warmup_steps": 0, "precision": "fp32",
                      "device": "cpu", "threads": 1, "eval_every": 1, "eval_batches": 1, "save_every": 1},
        }
    )  # fmt: skip
    train(cfg, root / "run")
    return root / "run"


def llama(vocab: int) -> nn.Module:
    """A Llama-shaped checkpoint of the posenc run's size, random weights (seed 0), eval mode, fp32."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=vocab, hidden_size=D_MODEL, intermediate_size=FFN, num_hidden_layers=N_LAYER,
        num_attention_heads=N_HEAD, num_key_value_heads=N_HEAD, max_position_embeddings=16384,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return tf.AutoModelForCausalLM.from_config(cfg).eval()


def generate(model: nn.Module) -> Decoder:
    """`transformers`' greedy `generate` for exactly `steps` new tokens (no end-of-text stop, no processors)."""
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0

    def run(prompts: Tensor, steps: int) -> Tensor:
        out = model.generate(
            prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=steps, min_new_tokens=steps,
            do_sample=False, num_beams=1,
        )  # fmt: skip
        return out[:, prompts.shape[1] :]

    return run


def ours(model: nn.Module) -> Decoder:
    return lambda prompts, steps: greedy_decode(model, prompts, steps)


def timed(decoders: dict[str, Decoder], prompts: Tensor, steps: int, rounds: int) -> dict[str, tuple[float, Tensor]]:
    """{name: (best seconds, tokens)}: the decoders alternate within each round, after one warm-up each."""
    best: dict[str, float] = dict.fromkeys(decoders, float("inf"))
    tokens: dict[str, Tensor] = {}
    with torch.inference_mode():
        for name, decode in decoders.items():
            tokens[name] = decode(prompts[:, :64], 2)  # warm-up
        for r in range(rounds):
            for name in list(decoders) if r % 2 == 0 else list(decoders)[::-1]:
                start = time.perf_counter()
                tokens[name] = decoders[name](prompts, steps)
                best[name] = min(best[name], time.perf_counter() - start)
    return {name: (best[name], tokens[name]) for name in decoders}


def report(title: str, results: dict[str, tuple[float, Tensor]], reference: str, batch: int, steps: int) -> None:
    ref_s, ref_tokens = results[reference]
    for name, (seconds, tokens) in results.items():
        same = "same tokens" if torch.equal(tokens, ref_tokens) else "DIFFERENT tokens"
        ratio = ref_s / seconds
        print(f"  {title:<13} {name:<22} {batch * steps / seconds:8.1f} tok/s  {ratio:5.2f}x generate  ({same})")


def cpu_model() -> str:
    """lscpu's model name (from /proc/cpuinfo), else the platform's machine name."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--steps", type=int, default=32, help="new tokens per prompt")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--full-cap", type=int, default=2048, help="longest prompt the full-forward path decodes")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers.utils import logging as tf_logging

    tf_logging.set_verbosity_error()  # generate's note on passing the exported run's training length
    cpu = cpu_model()
    print(f"fp32, 1 thread, torch {torch.__version__}, {cpu}; best of {args.rounds} rounds, {args.steps} new tokens")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run_dir = posenc_run(root)
        export_run(run_dir, root / "hf", verify=False)
        import transformers as tf

        run = load_run(run_dir)
        exported = tf.AutoModelForCausalLM.from_pretrained(str(root / "hf"), dtype=torch.float32).eval()
        vocab = int(run.model.wte.weight.shape[0])
        checkpoint = llama(vocab)
        wrapped = HFCausalLM(checkpoint, HFScheme("rope", None)).eval()
        for length in args.lengths:
            batch = 4 if length <= 512 else 2 if length <= 2048 else 1
            prompts = torch.randint(1, vocab, (batch, length), generator=torch.Generator().manual_seed(length))
            print(f"prompt {length} tokens, batch {batch}:")
            first = timed({"generate": generate(exported), "posenc cache": ours(run.model)}, prompts, args.steps,
                          args.rounds)  # fmt: skip
            report("posenc run", first, "generate", batch, args.steps)
            pair = {"generate": generate(checkpoint), "greedy_decode cache": ours(wrapped)}
            if length <= args.full_cap:
                pair["greedy_decode full"] = ours(FullForward(wrapped))
            report("transformers", timed(pair, prompts, args.steps, args.rounds), "generate", batch, args.steps)


if __name__ == "__main__":
    main()
