"""`passkey`: greedy retrieval of a key hidden at a depth, per length × depth (`posenc eval-passkey`; prompts and
decoding in `posenc_cli.evaluation.passkey`).

The depths of one length are one group of the loop (decoded in one batch, stored together); cells are keyed by
their settings, the position ids fed and the checkpoint. A sweep job runs eval-passkey's defaults at its
`eval.lengths`; a sweep and `compare` show the stored cells as eval-passkey's table, with each run's competence gate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from posenc_cli import __version__
from posenc_cli.data.sources.passkey import DEFAULT_DIGITS
from posenc_cli.errors import LengthBeyondScheme
from posenc_cli.evaluation.competence import PASSKEY, check_threshold, result_competence
from posenc_cli.evaluation.loop import Entry, evaluate
from posenc_cli.evaluation.passkey import (
    PASSKEY_FILE,
    PasskeyConfig,
    PromptTooShort,
    evaluate_passkey_model,
)
from posenc_cli.evaluation.perplexity.planning import resolve_dtype
from posenc_cli.evaluation.positions import Positions, trained_positions
from posenc_cli.evaluation.results import checkpoint_key, positions_key
from posenc_cli.evaluation.runs import evaluate_each_run, find_runs
from posenc_cli.evaluation.tasks import register
from posenc_cli.evaluation.tasks.base import EvalTask, Progress, Summary
from posenc_cli.report.gate import DEFAULT_COMPETENCE
from posenc_cli.report.passkey_report import passkey_table

if TYPE_CHECKING:
    from posenc_cli.config import Config
    from posenc_cli.run.load import LoadedRun

__all__ = [
    "PasskeyEntry",
    "PasskeyTask",
    "entry_key",
    "evaluate_passkey_paths",
    "evaluate_passkey_run",
    "passkey_gates",
]


@dataclass(frozen=True, kw_only=True)
class PasskeyEntry(Entry):
    """One length × depth cell of `eval/passkey.json`; the fields in the order of the stored keys."""

    length: int
    multiple: float
    depth: float
    trials: int
    digits: int
    seed: int
    dtype: str
    positions: dict[str, Any] = field(default_factory=lambda: Positions().to_json())  # the ids fed (in the key)
    checkpoint: dict[str, Any] = field(default_factory=dict)
    status: str = "n/a"
    reason: str | None = None
    correct: int | None = None
    accuracy: float | None = None
    token_accuracy: float | None = None
    samples: list[dict[str, str]] = field(default_factory=list)
    posenc_version: str = __version__
    created: str = ""


def entry_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    """Two entries measure the same cell when these agree (the checkpoint too: see `results.checkpoint_key`)."""
    cell = (entry["length"], entry["depth"], entry["trials"], entry["digits"], entry["seed"], entry["dtype"])
    return (*cell, *positions_key(entry), *checkpoint_key(entry))


@register
class PasskeyTask(EvalTask):
    """eval-passkey on one loaded run with `cfg` (digits None: the run's data.passkey_digits, else 5)."""

    name = "passkey"
    command = "eval-passkey"
    results_file = PASSKEY_FILE
    unwritable = "raise"
    summary_rank = 1

    def __init__(
        self,
        run: LoadedRun,
        cfg: PasskeyConfig,
        *,
        device: str | torch.device | None = None,
        progress: Progress = None,
    ) -> None:
        cfg.validate()
        super().__init__(run, device=device, progress=progress)
        self.cfg = cfg
        self.digits = cfg.digits if cfg.digits is not None else getattr(run.config.data, "passkey_digits", None)
        self.digits = self.digits if self.digits is not None else DEFAULT_DIGITS
        self.dtype = resolve_dtype(cfg.dtype, run.meta.precision, self.device)
        self.positions = trained_positions(run.config)  # a randomized-position run reads at draws from its range

    @classmethod
    def for_job(cls, run: LoadedRun, cfg: Config, *, device: torch.device, progress: Progress = None) -> PasskeyTask:
        """eval-passkey's defaults at the job's `eval.lengths` (multiples of the training length)."""
        return cls(run, PasskeyConfig(lengths=cfg.eval.lengths), device=device, progress=progress)

    def plan(self) -> Iterator[list[PasskeyEntry]]:
        _, base_length = self.run.meta.lengths(self.run.config)
        for length, multiple in self.cfg.planned_lengths(base_length):
            yield [
                PasskeyEntry(
                    length=length,
                    multiple=multiple,
                    depth=float(d),
                    trials=self.cfg.trials,
                    digits=self.digits,
                    seed=self.cfg.seed,
                    dtype=self.dtype,
                    positions=self.positions.to_json(),
                )
                for d in self.cfg.depths
            ]

    key = staticmethod(entry_key)

    def measure(self, group: Sequence[PasskeyEntry]) -> list[PasskeyEntry]:
        if (beyond := self.positions.beyond_range(group[0].length)) is not None:
            return [c.not_measured(beyond) for c in group]
        try:
            measured = evaluate_passkey_model(
                self.run.model,
                self.run.tokenizer,
                length=group[0].length,
                depths=self.cfg.depths,
                trials=self.cfg.trials,
                digits=self.digits,
                seed=self.cfg.seed,
                batch_tokens=self.cfg.batch_tokens,
                dtype=self.dtype,
                device=self.device,
                progress=self.progress,
                positions=self.positions,
            )
        except LengthBeyondScheme as e:  # the same reason text as eval-extrapolate
            return [c.not_measured(e.reason) for c in group]
        except PromptTooShort as e:
            return [c.not_measured(str(e)) for c in group]
        keys = ("correct", "accuracy", "token_accuracy", "samples")
        return [c.measured(**{k: m[k] for k in keys}) for c, m in zip(group, measured, strict=True)]

    @classmethod
    def cell(cls, entry: dict[str, Any]) -> tuple[Any, ...]:
        return int(entry["length"]), float(entry["depth"])

    @classmethod
    def summarise(
        cls, results: Sequence[dict[str, Any]], *, threshold: float | None = None, competence: float | None = None
    ) -> Summary | None:
        """eval-passkey's table of the runs' stored cells, with each run's competence gate."""
        if not results:
            return None
        competence = DEFAULT_COMPETENCE if competence is None else competence
        gates = passkey_gates(results, competence)
        table = passkey_table(results, [(g[PASSKEY].status, g[PASSKEY].accuracy) for g in gates], competence)
        return Summary(cls.name, list(results), gates, [table])


def passkey_gates(results: Sequence[dict[str, Any]], competence: float = DEFAULT_COMPETENCE) -> list[dict[str, Any]]:
    """{"passkey": the competence gate (`evaluation.competence`)} of each run's eval-passkey result doc."""
    check_threshold(competence)
    return [{PASSKEY: result_competence(r, PASSKEY, PASSKEY, competence)} for r in results]


def evaluate_passkey_run(
    run: LoadedRun,
    cfg: PasskeyConfig,
    *,
    device: str | torch.device | None = None,
    force: bool | None = None,
    progress: Progress = None,
) -> dict[str, Any]:
    """Measure (or reuse) every length × depth cell of `cfg` for a loaded run and store them in eval/passkey.json.

    Returns the results doc restricted to this call's entries (length-major, depth-minor) plus "path" and "reused".
    A run being trained right now is refused.
    """
    task = PasskeyTask(run, cfg, device=device, progress=progress)
    out = evaluate(task, force=cfg.force if force is None else force)
    out.pop("not_saved")  # a passkey results file that cannot be written raises
    return out


def evaluate_passkey_paths(
    paths: Sequence[Path | str],
    cfg: PasskeyConfig,
    *,
    device: str | torch.device = "auto",
    threads: int = 0,
    force: bool | None = None,
    progress: Progress = None,
    on_run: Callable[[Path, int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Find the runs below `paths` and evaluate each in turn (one model in memory at a time)."""
    cfg.validate()

    def one(run: LoadedRun, run_device: torch.device) -> dict[str, Any]:
        return evaluate_passkey_run(run, cfg, device=run_device, force=force, progress=progress)

    return evaluate_each_run(find_runs(paths), one, device=device, threads=threads, on_run=on_run)
