"""Loading a run: model, config, metadata and tokenizer of a run directory, every file verified (`load_run`). A
checkpoint whose meta.json says its positions were dropped (train.drope_at) loads as the model without them."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from posenc_cli.config import Config
from posenc_cli.data.tokenizer import Tokenizer, load_tokenizer
from posenc_cli.errors import CheckpointError, UserError
from posenc_cli.model import GPT, build_model
from posenc_cli.run.config_load import config_from_dict
from posenc_cli.run.drope import check_dropped, drop_as_recorded
from posenc_cli.run.journal import committed_file
from posenc_cli.run.layout import CONFIG_FILE, META_FILE, MODEL_FILE
from posenc_cli.run.memory import LOAD_BYTES_PER_PARAM, check_fits
from posenc_cli.run.meta import RunMeta, read_meta, require_complete
from posenc_cli.run.verified import load_tensors, read_verified
from posenc_cli.run.weights import load_weights_into
from posenc_cli.untrusted import loads_yaml


@dataclass
class LoadedRun:
    path: Path
    model: nn.Module  # posenc_cli.model.GPT
    config: Config
    meta: RunMeta  # the run's identity apart from the record of what made it
    tokenizer: Tokenizer
    positions_dropped_at: int | None = None  # DroPE: the step after which the model has no positions (None: never)

    @property
    def scheme_label(self) -> str:
        """The scheme the loaded model computes with: pos.name, or e.g. 'rope, dropped at 14000' (DroPE)."""
        name = str(self.config.pos.name)
        return name if self.positions_dropped_at is None else f"{name}, dropped at {self.positions_dropped_at}"


def model_like(run: LoadedRun, cfg: Config | None = None) -> GPT:
    """A new model of `cfg` (default: the run's config) in the run's state: without positions when the run dropped
    them (DroPE), so that `load_state_dict(run.model.state_dict())` gives the run's model under `cfg`. What code that
    rebuilds a loaded run's model with changed settings (a temperature, a scaling) must build instead of
    `build_model`, which would give a dropped run its scheme back."""
    model = build_model(cfg if cfg is not None else run.config, run.tokenizer.vocab_size)
    if run.positions_dropped_at is not None:
        model.drop_positions(keep_layout=run.model.keeps_layout)
    return model


def read_config(run_dir: Path, meta: dict[str, Any]) -> Config:
    """The verified config.yaml of the committed checkpoint (`meta`: its meta.json), as a `Config`."""
    path = committed_file(run_dir, CONFIG_FILE)
    data = read_verified(run_dir, meta["files"], CONFIG_FILE)
    try:
        return config_from_dict(loads_yaml(data, source=path, what="config", error=CheckpointError), saved=True)
    except UserError as e:
        raise CheckpointError(f"{path}: invalid config ({str(e).splitlines()[0].removeprefix(f'{path}: ')})") from e


def load_run(path: Path | str, device: str | torch.device = "cpu", *, complete_only: bool = True) -> LoadedRun:
    """Model, config, metadata and tokenizer of a run directory, with every file verified.

    Raises `CheckpointError` naming the file when anything is missing, truncated, corrupt or tampered with, and
    (unless `complete_only=False`) when the run did not finish training (`require_complete`): evaluating,
    extending or exporting it would label the numbers of unfinished weights (an interrupted fine-tune's are still
    its parent's) as the run's. A trainer committing a new checkpoint while we read can make one attempt
    inconsistent; we then read again.
    """
    run_dir = Path(path)
    for _attempt in range(3):
        meta = read_meta(run_dir)
        if complete_only:
            require_complete(meta, run_dir)
        try:
            return _load_run_once(run_dir, meta, device)
        except CheckpointError:
            with contextlib.suppress(UserError, OSError):
                if read_meta(run_dir) != meta:
                    continue  # a new checkpoint was committed meanwhile
            raise
    raise CheckpointError(f"{run_dir}: checkpoint kept changing while being read")


def _load_run_once(run_dir: Path, meta: dict[str, Any], device: str | torch.device) -> LoadedRun:
    for name in sorted(meta["files"]):  # every file, resume state included, must match its checksum
        if name not in (MODEL_FILE, CONFIG_FILE):
            read_verified(run_dir, meta["files"], name)
    cfg = read_config(run_dir, meta)
    tok_dir = committed_file(run_dir, "tokenizer.json").parent
    try:
        tokenizer = load_tokenizer(cfg.tokenizer, tok_dir)
    except UserError as e:
        raise CheckpointError(f"{run_dir}: tokenizer could not be loaded ({e})") from e
    expected_fp = (meta.get("tokenizer") or {}).get("fingerprint")
    if expected_fp is not None and tokenizer.fingerprint != expected_fp:
        raise CheckpointError(f"{tok_dir / 'tokenizer.json'}: tokenizer fingerprint differs from {META_FILE}")
    check_fits(cfg, tokenizer.vocab_size, LOAD_BYTES_PER_PARAM, f"loading {run_dir}")  # before any allocation
    tensors = load_tensors(run_dir, meta, MODEL_FILE)
    model = build_model(cfg, tokenizer.vocab_size)
    dropped = check_dropped(cfg, meta, committed_file(run_dir, META_FILE))
    if dropped is not None:
        drop_as_recorded(model, meta)  # DroPE: trained on without positions from that step (`posenc_cli.run.drope`)
    load_weights_into(model, tensors, committed_file(run_dir, MODEL_FILE))
    model.to(device)
    model.eval()
    return LoadedRun(
        path=run_dir,
        model=model,
        config=cfg,
        meta=RunMeta.from_json(meta),
        tokenizer=tokenizer,
        positions_dropped_at=dropped,
    )
