"""`flipflop`, `flipflop_sparse`, `flipflop_dense`: flip-flop language modelling (Liu et al., NeurIPS 2023, arXiv
2306.00946), scored at the bit after every read.

A sequence is instructions `w` (write), `r` (read) and `i` (ignore), each followed by a bit; a read's bit is the bit of
the latest write, the bits after writes and ignores are random. FFL(p) draws each instruction as ignore with
probability p and as write or read with (1 − p)/2 each. The reference data (HF dataset `synthseq/flipflop`, card
@91ef5c9) holds 256 instructions (512 tokens) per sequence: `train` and `val` from FFL(0.8), `val_dense` from
FFL(0.1), `val_sparse` from FFL(0.98); only the bit after each `r` is deterministic and scored (the share of those
bits mispredicted is the paper's error). The three tasks here are those three distributions in one text layout, so a
model trained on `flipflop` (FFL(0.8)) is tested on `flipflop_sparse` and `flipflop_dense` with the prompts it
knows: `FF: w 1 i 0 r 1`. Every instruction and bit is one character after a space (the card tokenises w r i 0 1 as
five ids; each is two bytes here), so 256 instructions are 1,024 bytes plus the header.

Posenc's choices where the card is silent: the first instruction is a write (every read has an answer) and the last
a read (the document ends with a scored bit: `Example.answer` is that bit, greedy exact match scores the last read);
the reads' bits are the scored pieces (`Example.scored`) that `eval-algorithmic` scores teacher-forced (the
reference's per-read error, see `evaluation.teacher_forced`). Length n = the number of instructions (at least 2:
the write and the read); in distribution the reference's single length (`train_min` = 256, capped at
`data.max_length`), beyond it posenc's own longer sequences of the same FFL(p) (the dataset has one length), beside
the reference's sparse/dense splits at the training length.
"""

from __future__ import annotations

import re

import numpy as np

from posenc_cli.data.algorithmic import register
from posenc_cli.data.algorithmic._scored import pieces_of, scored_example
from posenc_cli.data.algorithmic.base import AlgorithmicTask, Example, match

HEADER = "FF:"
PROMPT = re.compile(r"FF:((?: [wri] [01])*) r")
TRAIN_INSTRUCTIONS = 256  # the dataset's 512 tokens per sequence


def instructions(rng: np.random.Generator, n: int, p_ignore: float) -> tuple[list[str], list[str]]:
    """`n` >= 2 instructions of FFL(`p_ignore`), the first a write and the last a read, and their bits (a read's:
    the latest write's)."""
    if n < 2:
        raise ValueError(f"a flip-flop sequence has at least 2 instructions (a write and a read), got {n}")
    ops = ["w"]
    ops += rng.choice(["w", "r", "i"], size=n - 2, p=[(1 - p_ignore) / 2, (1 - p_ignore) / 2, p_ignore]).tolist()
    ops.append("r")
    bits: list[str] = []
    memory = ""
    for op, bit in zip(ops, rng.integers(0, 2, size=n).tolist(), strict=True):  # one step per instruction
        if op == "r":
            bits.append(memory)
        else:
            bits.append(str(bit))
            memory = str(bit) if op == "w" else memory
    return ops, bits


class FlipFlop(AlgorithmicTask):
    """FFL(`p_ignore`); the registered subclasses are the dataset's three distributions."""

    p_ignore: float
    summary = "the bit of the latest write at every read (flip-flop language modelling)"
    unit = "instructions"
    min_length = 2
    train_min = TRAIN_INSTRUCTIONS
    reference = "HF dataset synthseq/flipflop (card @91ef5c9); Liu et al. 2023, arXiv 2306.00946"
    layout = "flipflop"  # one text layout for the three splits
    suite = "synthetic"
    reference_metric = "token_accuracy"  # the paper's error is per read: 1 - the share of read bits right

    @classmethod
    def sample(cls, rng: np.random.Generator, length: int) -> Example:
        ops, bits = instructions(rng, length, cls.p_ignore)
        tokens = [
            (t, scored) for op, bit in zip(ops, bits, strict=True) for t, scored in ((op, False), (bit, op == "r"))
        ]
        return scored_example(pieces_of(HEADER, tokens), length)

    @classmethod
    def solve(cls, prompt: str) -> str:
        """The bit of the latest write before the read that ends `prompt`."""
        pairs = match(PROMPT, prompt, "flipflop").group(1).split()
        writes = [bit for op, bit in zip(pairs[::2], pairs[1::2], strict=True) if op == "w"]
        if not writes:
            raise ValueError(f"not a flipflop prompt: a read before any write: {prompt!r}")
        return f" {writes[-1]}"


@register
class FlipFlopTrain(FlipFlop):
    name = "flipflop"
    summary = "flip-flop FFL(0.8): the bit of the latest write at every read (train / val distribution)"
    p_ignore = 0.8


@register
class FlipFlopSparse(FlipFlop):
    name = "flipflop_sparse"
    summary = "flip-flop FFL(0.98): rare writes and reads (the val_sparse split)"
    p_ignore = 0.98


@register
class FlipFlopDense(FlipFlop):
    name = "flipflop_dense"
    summary = "flip-flop FFL(0.1): frequent writes and reads (the val_dense split)"
    p_ignore = 0.1
