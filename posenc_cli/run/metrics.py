"""metrics.jsonl: one JSON object per logged step, appended as training goes; cut back on resume."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import IO, Any

from posenc_cli.fsutil import atomic_write_text, named_storage_error


class MetricsLog:
    """Append-only JSON-lines log; `flush(durable=True)` is called before each checkpoint commit."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None

    def append(self, record: dict[str, Any]) -> None:
        """Write one record; a storage error (a full disk: the flush's OSError names no file) names this log."""
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open across steps)
            self._file.write(json.dumps(_finite_or_none(record), separators=(",", ":")) + "\n")
            self._file.flush()
        except OSError as e:
            raise named_storage_error(e, self.path) from e

    def flush(self, durable: bool = False) -> None:
        if self._file is not None:
            try:
                self._file.flush()
                if durable:
                    os.fsync(self._file.fileno())
            except OSError as e:
                raise named_storage_error(e, self.path) from e

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def truncate_after(self, step: int) -> None:
        """Keep only records with `step <= step` (and drop a torn last line); atomic rewrite."""
        self.close()
        if not self.path.exists():
            return
        kept = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= step]
        atomic_write_text(self.path, "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in kept))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All well-formed records of a metrics.jsonl (a line torn by a kill is skipped)."""
    records = []
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records


def _finite_or_none(record: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN/inf: write them as null (a diverged step's loss is still logged)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
