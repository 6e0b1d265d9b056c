"""Sweep files for the sweep tests: a micro model and sweeps of one to four stages over it (train 4 steps)."""

from __future__ import annotations

MICRO_MODEL = (
    "d_model: 32\nn_layer: 2\nn_head: 2\nnorm: layernorm\nmlp_ratio: 2\nbias: true\ndropout: 0.0\ninit_std: 0.02\n"
)
COMMON = (
    "[model=micro, data=text, 'data.paths=[corpus]', train.steps=4, train.warmup_steps=1, train.seq_len=16, "
    "train.batch_size=4, train.eval_every=2, train.eval_batches=2, train.save_every=4, train.log_every=2, "
    "train.precision=fp32, train.threads=1, eval.tokens=256, 'eval.lengths=[1,2,4]']"
)
TWO_STAGES = f"""# posenc sweep two --config-dir DIR
overrides: {COMMON}
stages:
  - name: train
    params: {{pos: "rope,alibi"}}
  - name: extend
    action: extend
    parent: train/pos=rope
    overrides: [extend.method=yarn, extend.factor=2]
    label: "rope → yarn x2"
"""
REMAP = f"""# posenc sweep remap --config-dir DIR
overrides: {COMMON}
stages:
  - name: train
    params: {{pos: "rope"}}
  - name: self-extend
    action: extend
    parent: train/pos=rope
    overrides: [extend.remap=self-extend, extend.remap_window=8, extend.remap_group=2]
    label: "self-extend W=8 G=2"
  - name: longrope
    action: extend
    parent: train/pos=rope
    overrides: [extend.factor=2, extend.method=longrope, extend.longrope_search=2]
    label: "longrope x2 (searched)"
  - name: rerope
    action: extend
    parent: train/pos=rope
    overrides: [extend.remap=rerope, extend.remap_window=8, extend.remap_logn=false]
    label: "rerope W=8, no log-n"
"""
ONE_STAGE = f"""# posenc sweep one --config-dir DIR
overrides: {COMMON}
stages:
  - name: train
    params: {{pos: "nope,alibi"}}
"""
