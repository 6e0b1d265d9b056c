"""Greedy decoding with the KV cache against a full forward per generated token, on the same `eval-tasks` cells.

    python benchmarks/kv_decode.py RUN --lengths 4 --trials 8 --rounds 2   # a model=tiny run, at 4x its length

Runs `posenc eval-tasks RUN ... --force` in this process, alternating two decoders for `--rounds` rounds: "cache"
(posenc's default: the prompt once, then one (B, 1) forward per token against `posenc_cli.kv_cache`) and "full" (what
eval-tasks did before: the whole prompt plus the tokens so far at every step). It counts the cells whose score or
sampled outputs differ between the two (none in fp32: pass `--dtype fp32`), and prints wall time and generated
tokens per second for each (minimum over rounds).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.evaluation import passkey


def full_forward_decode(
    model: torch.nn.Module,
    prompts: torch.Tensor,
    steps: int,
    *,
    use_bf16: bool,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The decoder eval-tasks used before the KV cache: one full forward over everything so far per token."""
    x = prompts
    for _ in range(steps):
        ids = None if position_ids is None else position_ids[:, : x.shape[1]]  # (B, T)
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(x, position_ids=ids)  # (B, T, V)
        x = torch.cat([x, logits[:, -1, :].float().argmax(dim=-1, keepdim=True)], dim=1)
    return x[:, prompts.shape[1] :]


def run_once(args: list[str], out: Path) -> tuple[float, list[dict], int]:
    """(wall seconds, the cells' scores, generated tokens) of one eval-tasks call."""
    generated = 0
    inner = passkey.greedy_decode

    def counting(model, prompts, steps, **kw):  # type: ignore[no-untyped-def]
        nonlocal generated
        generated += prompts.shape[0] * steps
        return inner(model, prompts, steps, **kw)

    passkey.greedy_decode = counting
    try:
        start = time.perf_counter()
        result = CliRunner().invoke(app, ["eval-tasks", *args, "--force", "--json", str(out)])
        wall = time.perf_counter() - start
    finally:
        passkey.greedy_decode = inner
    if result.exit_code != 0:
        raise SystemExit(result.output or repr(result.exception))
    doc = json.loads(out.read_text())
    cells = [
        {k: e.get(k) for k in ("task", "length", "depth", "status", "score", "exact", "samples") if k in e}
        for run in doc["runs"]
        for e in run["entries"]
    ]
    return wall, cells, generated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run")
    parser.add_argument("--rounds", type=int, default=2)
    ns, rest = parser.parse_known_args()  # the rest: eval-tasks options, e.g. --lengths 4 --trials 8
    cached = passkey._greedy_cached
    results: dict[str, list[tuple[float, int]]] = {"cache": [], "full": []}
    scores: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(ns.rounds):
            for name in ("cache", "full"):
                passkey._greedy_cached = cached if name == "cache" else full_forward_decode
                try:
                    wall, cells, tokens = run_once([ns.run, *rest], Path(tmp) / f"{name}.json")
                finally:
                    passkey._greedy_cached = cached
                results[name].append((wall, tokens))
                scores[name] = cells
    pairs = list(zip(scores["cache"], scores["full"], strict=True))
    other_score = sum(a.get("score") != b.get("score") for a, b in pairs)
    other_outputs = sum(a.get("samples") != b.get("samples") for a, b in pairs)
    print(
        f"cells: {len(pairs)}; other score: {other_score}; other sampled outputs: {other_outputs} "
        "(fp32: none expected; bf16 rounds the two paths differently, so near-tied logits can flip a token)"
    )
    for name, rows in results.items():
        wall, tokens = min(rows)
        print(f"{name:>5}: {wall:7.2f} s wall, {tokens} generated tokens, {tokens / wall:8.1f} tokens/s")
    print(f"speed-up (full / cache wall time): {min(results['full'])[0] / min(results['cache'])[0]:.2f}x")


if __name__ == "__main__":
    main()
