"""LongPPL's evaluator: the one run that chooses the key tokens every evaluated run is scored on
(`evaluation.longppl`; PKU-ML/LongPPL's `--evaluator-model`, perplexity/run_ppl.sh).

`find_evaluator` finds the named directory (a relative path is looked up from the current directory, then from each
directory above the evaluated run, nearest first, so a sweep's `eval.longppl_evaluator=train/pos=alibi` names a job
of the same sweep) and refuses in one line anything that is not a readable posenc run. `KeyEvaluator.keys` gives a
cell's key set: from memory, from the evaluator's `eval/longppl_keys/` (`longppl.read_keys`), or measured with the
evaluator's model (`measuring.evaluate_model` with `key_tokens`) and stored there. A run whose tokenizer differs from
the evaluator's is refused (`check_tokenizer`): key tokens are stream indices, which name the same text only under
one tokenizer.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from posenc_cli.config import EvalConfig
from posenc_cli.errors import ConfigError, LengthBeyondScheme, UserError
from posenc_cli.evaluation.longppl import KeyTokens, keys_id, keys_identity, read_keys, write_keys
from posenc_cli.evaluation.perplexity.measuring import Progress, evaluate_model
from posenc_cli.evaluation.perplexity.planning import resolve_dtype
from posenc_cli.evaluation.positions import Positions, draw_layers, resolve_positions
from posenc_cli.evaluation.results import checkpoint_identity
from posenc_cli.evaluation.runs import check_run_files
from posenc_cli.run.meta import is_run_dir

if TYPE_CHECKING:
    from posenc_cli.run.load import LoadedRun

__all__ = ["KeyEvaluator", "find_evaluator"]


def find_evaluator(given: str | Path, near: Path | None = None) -> Path:
    """The evaluator's run directory: `given`, or for a relative path not found from here, the first of
    `near`'s ancestors holding it. ConfigError (one line) for no such directory or one that is not a posenc run;
    the run's own error (`runs.check_run_files`) for a broken one."""
    path = Path(given)
    candidates = [path]
    if not path.is_absolute() and near is not None:
        candidates += [parent / path for parent in Path(near).resolve().parents]
    found = next((c for c in candidates if c.exists()), None)
    if found is None:
        raise ConfigError(f"LongPPL evaluator {given}: no such directory")
    if not found.is_dir() or not is_run_dir(found):
        raise ConfigError(f"LongPPL evaluator {given}: not a posenc run directory (no meta.json of kind posenc-run)")
    try:
        check_run_files(found)
    except UserError as e:
        raise ConfigError(f"LongPPL evaluator {given}: {str(e).splitlines()[0]}") from e
    return found


@dataclass
class KeyEvaluator:
    """A loaded evaluator run and the key sets it chose in this process (by `longppl.keys_id`)."""

    run: LoadedRun
    memo: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def load(cls, given: str | Path, device: str | torch.device = "cpu", near: Path | None = None) -> KeyEvaluator:
        """The evaluator named `given` (`find_evaluator`), loaded onto `device`."""
        # deferred: the weights' loader only when an evaluator is named
        from posenc_cli.run.load import load_run

        return cls(load_run(find_evaluator(given, near), device=device))

    @property
    def path(self) -> Path:
        return Path(self.run.path)

    @property
    def settings(self) -> KeyTokens:
        """The short context: the evaluator's training length, its blocks of L // 4, α = 2, β = −2."""
        train_length, _base = self.run.meta.lengths(self.run.config)
        return KeyTokens(train_length=train_length)

    def is_run(self, run: LoadedRun) -> bool:
        return Path(run.path).resolve() == self.path.resolve()

    def check_tokenizer(self, run: LoadedRun) -> None:
        """Refuse a run whose tokenizer is not the evaluator's, in one line."""
        ours, theirs = str(self.run.tokenizer.fingerprint), str(run.tokenizer.fingerprint)
        if ours != theirs:
            raise ConfigError(
                f"{run.path}: its tokenizer ({theirs}) is not the LongPPL evaluator's ({ours}, {self.path}); "
                "key tokens are chosen per tokenizer: name an evaluator trained with the same tokenizer"
            )

    def positions(self, cfg: EvalConfig) -> Positions:
        """The position ids the evaluator is fed: its own (sorted draws for a randomized-positions run, per layer
        where it trained so, seed 0)."""
        random_range = int(getattr(self.run.config.train, "random_positions", 0) or 0)
        return resolve_positions(None, random_range, 0, run=str(self.path), layers=draw_layers(self.run.config))

    def dtype(self, cfg: EvalConfig, device: torch.device) -> str:
        return resolve_dtype(cfg.dtype, self.run.meta.precision, device)

    def identity(self, cell: dict[str, Any], tokenizer: str, cfg: EvalConfig, device: torch.device) -> dict[str, Any]:
        """The key set's identity for a cell (an entry's JSON: data, protocol, stride, length, tokens)."""
        return keys_identity(
            evaluator=checkpoint_identity(self.run.meta),
            data=cell["data"],
            tokenizer=tokenizer,
            protocol=cell["protocol"],
            stride=cell["stride"],
            length=cell["length"],
            tokens=cell["tokens"],
            settings=self.settings,
            dtype=self.dtype(cfg, device),
            positions=self.positions(cfg).to_json(),
        )

    def stamp(self, identity: dict[str, Any]) -> dict[str, Any]:
        """What an entry scored on this key set records (`entries.ExtrapolateEntry.longppl_evaluator`): the
        evaluator's directory name and path (for the table's caption), its checkpoint and the key set's id."""
        return {
            "run": self.path.name,
            "path": str(self.path.resolve()),
            "checkpoint": checkpoint_identity(self.run.meta),
            "keys": keys_id(identity),
        }

    def keys(
        self,
        cell: dict[str, Any],
        stream: np.ndarray,
        tokenizer: str,
        cfg: EvalConfig,
        *,
        stride: int,
        device: torch.device,
        progress: Progress | None = None,
    ) -> tuple[np.ndarray | None, dict[str, Any]]:
        """(the cell's key tokens as sorted stream indices, the entry's stamp): from memory, the evaluator's stored
        sets, or measured now and stored (when its directory can be written). None for a length the evaluator
        cannot read (its stamp then says why)."""
        identity = self.identity(cell, tokenizer, cfg, device)
        stamp = self.stamp(identity)
        kid = stamp["keys"]
        if kid not in self.memo:
            stored = read_keys(self.path, identity)
            if stored is None:
                try:
                    stored = self._choose(cell, stream, stride, cfg, device, progress)
                except LengthBeyondScheme as e:
                    return None, {**stamp, "unavailable": e.reason}
                with contextlib.suppress(OSError):  # a read-only evaluator: chosen again by the next command
                    write_keys(self.path, identity, stored)
            self.memo[kid] = stored
        return self.memo[kid], stamp

    def _choose(
        self,
        cell: dict[str, Any],
        stream: np.ndarray,
        stride: int,
        cfg: EvalConfig,
        device: torch.device,
        progress: Progress | None,
    ) -> np.ndarray:
        """The evaluator's key tokens over the cell's windows (its long context against its training length)."""
        result = evaluate_model(
            self.run.model,
            stream,
            None,
            length=cell["length"],
            protocol=cell["protocol"],
            stride=stride,
            n_tokens=cfg.tokens,
            batch_tokens=cfg.batch_tokens,
            dtype=self.dtype(cfg, device),
            device=device,
            progress=(lambda what, done, total: progress(f"key tokens {what}", done, total)) if progress else None,
            positions=self.positions(cfg),
            key_tokens=self.settings,
        )
        return result["key_targets"]
