"""Training-step cost of each model option against the baseline: `python benchmarks/options_step.py [ROUNDS]`.

All configs in one process, interleaved round by round (so a shared machine's load hits them alike); the minimum over
rounds of one step's wall time (forward, backward, AdamW) per config, model=tiny (d 128, 4 layers, 4 heads),
pos=rope, batch 16 × 128 tokens, bf16 autocast as `posenc train` on CPU, one thread. Prints JSON (docs/commands/
model-options.md has the table)."""

import dataclasses
import json
import sys
import time

import torch

from posenc_cli.config import ModelConfig
from posenc_cli.model import GPT
from posenc_cli.positional import config_class

torch.set_num_threads(1)
CONFIGS = {
    "baseline": {},
    "attn_sinks": {"attn_sinks": True},
    "attn_gate=elementwise": {"attn_gate": "elementwise"},
    "attn_gate=headwise": {"attn_gate": "headwise"},
    "qk_norm=rms": {"qk_norm": "rms"},
    "qk_norm=l2": {"qk_norm": "l2"},
    "canon=ABCD": {"canon": "ABCD"},
    "canon=AC": {"canon": "AC"},
    "all": {"attn_sinks": True, "attn_gate": "headwise", "qk_norm": "rms", "canon": "ABCD"},
}
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
models, opts = {}, {}
for name, kw in CONFIGS.items():
    torch.manual_seed(0)
    m = GPT(dataclasses.replace(ModelConfig(), **kw), config_class("rope")(), 257, 128).train()
    models[name], opts[name] = m, torch.optim.AdamW(m.parameters(), lr=1e-3)
idx = torch.randint(0, 257, (16, 129), generator=torch.Generator().manual_seed(0))
times: dict[str, list[float]] = {n: [] for n in CONFIGS}


def step(name: str) -> float:
    m, opt = models[name], opts[name]
    t = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = m(idx[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t


for name in CONFIGS:  # warm-up
    step(name)
for _ in range(rounds):
    for name in CONFIGS:
        times[name].append(step(name))
base = min(times["baseline"])
out = {
    n: {
        "min_s": min(t),
        "relative": min(t) / base,
        "tokens_per_s": 16 * 128 / min(t),
        "params": sum(p.numel() for p in models[n].parameters()),
    }
    for n, t in times.items()
}
print(json.dumps(out, indent=1))
