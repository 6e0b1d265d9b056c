"""A run directory's files, and the limits its readers hold them to.

Layout of a run directory::

    model.safetensors   weights (fp32; tied embeddings stored once, as safetensors' `save_model` does)
    state.safetensors   resume state, tensors: optimizer moments/steps, RNG states (torch, cuda, numpy, sampler)
    state.json          resume state, scalars: step, tokens, optimizer param groups, python RNG, schedule
    config.yaml         the resolved config (`config_from_dict` rebuilds it without Hydra)
    tokenizer.json      only for non-byte tokenizers
    meta.json           kind, step, status, versions, data fingerprint, sha256 of every file above, ...
                        (`run.meta.RunMeta`: the run's identity apart from the record of the command that made it)
    metrics.jsonl       one JSON object per logged step (append-only; cut back to the checkpoint step on resume)

Where each part lives: `run.journal` commits a checkpoint's files atomically and gives the committed view,
`run.meta` reads and types meta.json, `run.verified` reads a file only after checking its size and checksum,
`run.weights` turns a model into its file and back, `run.load` loads a whole run, `run.resume_state` packs the
optimizer and RNG states.
"""

from __future__ import annotations

KIND = "posenc-run"
SCHEMA_VERSION = 1
MODEL_FILE = "model.safetensors"
STATE_FILE = "state.safetensors"
STATE_JSON = "state.json"
CONFIG_FILE = "config.yaml"
META_FILE = "meta.json"
METRICS_FILE = "metrics.jsonl"
PENDING = ".pending"
MAX_SMALL_FILE = 64 * 2**20  # config, JSON and tokenizer files; far above any real one
MAX_SAFETENSORS_HEADER = 100_000_000  # the header limit safetensors itself enforces
STATUSES = ("running", "interrupted", "complete")  # what `train` writes: at start / at a checkpoint, on a signal, done
