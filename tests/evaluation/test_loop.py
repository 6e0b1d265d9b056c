"""The shared measure loop (`posenc_cli.evaluation.loop`) on a toy task: groups, reuse by key, force, store=False,
unwritable storage, the common fields it stamps, typed entries that serialise in field order, and
`EvalTask.load_results`."""

from __future__ import annotations

import errno
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from posenc_cli import __version__
from posenc_cli.errors import CheckpointError
from posenc_cli.evaluation import results as eval_results
from posenc_cli.evaluation.loop import COMMON_FIELDS, Entry, evaluate, measure, results_header
from posenc_cli.evaluation.results import checkpoint_identity, checkpoint_key
from posenc_cli.evaluation.tasks import registry
from posenc_cli.evaluation.tasks.base import EvalTask
from posenc_cli.run.interrupts import run_lock
from posenc_cli.run.meta import RunMeta

META = RunMeta(step=5, files={"model.safetensors": "b" * 64})
CKPT = checkpoint_identity(META)


@dataclass(frozen=True, kw_only=True)
class ToyEntry(Entry):
    length: int
    depth: float
    checkpoint: dict[str, Any] = field(default_factory=dict)
    status: str = "n/a"
    reason: str | None = None
    score: float | None = None
    posenc_version: str = __version__
    created: str = ""


def key(e: dict[str, Any]) -> tuple[Any, ...]:
    return (e["length"], e["depth"], *checkpoint_key(e))


class ToyTask(EvalTask):
    """Groups of two depths per length; lengths above 100 cannot be measured. Counts its `measure` calls."""

    name, command = "toy", "eval-toy"
    results_file: ClassVar[Path] = Path("eval") / "toy.json"

    def __init__(self, run_dir: Path, lengths: Sequence[int], reusable: Any = None) -> None:
        run = SimpleNamespace(path=run_dir, meta=META, config=None, scheme_label="rope")
        super().__init__(run, device="cpu")  # type: ignore[arg-type]
        self.lengths, self.groups, self._reusable = lengths, 0, reusable

    def header(self) -> dict[str, Any]:
        return results_header("run", "rope", 64, 64)

    def plan(self) -> list[list[ToyEntry]]:
        return [[ToyEntry(length=n, depth=d) for d in (0.0, 1.0)] for n in self.lengths]

    key = staticmethod(key)

    def measure(self, group: Sequence[ToyEntry]) -> list[ToyEntry]:
        self.groups += 1
        if group[0].length > 100:
            return [e.not_measured("too long") for e in group]
        return [e.measured(score=e.length * e.depth) for e in group]

    def reusable(self, stored: dict[str, Any]) -> bool:
        return self._reusable is None or self._reusable(stored)


class Counter:
    def __init__(self) -> None:
        self.groups = 0


def run(
    path: Path, lengths: Sequence[int], counter: Counter, *, reusable: Any = None, unwritable: str = "report", **kw: Any
):
    """The loop on a toy task whose results file is `path` (its run directory two levels up)."""
    task = ToyTask(path.parent.parent, lengths, reusable)
    task.results_file = Path(path.parent.name) / path.name
    task.unwritable = unwritable  # type: ignore[assignment]
    try:
        return measure(task, **kw)
    finally:
        counter.groups += task.groups


def test_the_loop_stamps_the_common_fields(tmp_path: Path) -> None:
    (cell, _) = run(tmp_path / "eval" / "toy.json", [64], Counter()).entries
    assert set(COMMON_FIELDS) <= set(cell)
    assert cell["checkpoint"] == CKPT and cell["status"] == "ok" and cell["reason"] is None
    assert cell["posenc_version"] == __version__ and cell["created"]  # planned without either


def test_evaluate_returns_the_doc_and_refuses_a_run_being_trained(tmp_path: Path) -> None:
    out = evaluate(ToyTask(tmp_path, [64]))
    assert out["path"] == str(tmp_path) and out["reused"] == 0 and len(out["entries"]) == 2
    assert out["not_saved"] is None and out["train_length"] == 64
    with run_lock(tmp_path), pytest.raises(CheckpointError, match="being trained"):
        ToyTask(tmp_path, [64])


def test_entry_serialises_in_field_order() -> None:
    e = ToyEntry(length=3, depth=0.5, checkpoint=dict(CKPT))
    assert list(e.to_json()) == [
        "length",
        "depth",
        "checkpoint",
        "status",
        "reason",
        "score",
        "posenc_version",
        "created",
    ]


def test_a_stored_entry_that_is_not_reusable_is_measured_again_in_place(tmp_path: Path) -> None:
    path, counter = tmp_path / "eval" / "toy.json", Counter()
    run(path, [64, 128], counter)
    # a predicate rejecting one stored cell of the 64 group: that whole group is measured again, 128 reused
    again = run(path, [64, 128], counter, reusable=lambda e: not (e["length"] == 64 and e["depth"] == 1.0))
    assert counter.groups == 3 and again.reused == 2
    assert [e["length"] for e in json.loads(path.read_text())["entries"]] == [64, 64, 128, 128]  # replaced in place
    assert run(path, [64, 128], counter, reusable=lambda e: True).reused == 4 and counter.groups == 3


def test_measures_stores_reuses_and_forces(tmp_path: Path) -> None:
    path, counter = tmp_path / "eval" / "toy.json", Counter()
    first = run(path, [64, 128, 256], counter)
    assert counter.groups == 3 and first.reused == 0 and first.not_saved is None
    assert [(e["length"], e["status"]) for e in first.entries][::2] == [(64, "ok"), (128, "n/a"), (256, "n/a")]
    doc = json.loads(path.read_text())
    assert list(doc) == ["schema_version", "run", "scheme", "train_length", "base_length", "entries"]
    assert doc["entries"] == first.entries
    again = run(path, [64, 512], counter)  # 64 reused, 512 new
    assert counter.groups == 4 and again.reused == 2 and len(json.loads(path.read_text())["entries"]) == 8
    run(path, [64], counter, force=True)
    assert counter.groups == 5 and len(json.loads(path.read_text())["entries"]) == 8


def test_store_false_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "eval" / "toy.json"
    done = run(path, [64], Counter(), store=False)
    assert len(done.entries) == 2 and not path.exists()


@pytest.mark.parametrize("unwritable", ["report", "raise"])
def test_unwritable_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unwritable: str) -> None:
    def full(*args: Any, **kw: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("posenc_cli.evaluation.loop.update_results_file", full)
    counter = Counter()
    if unwritable == "raise":
        with pytest.raises(OSError):
            run(tmp_path / "eval" / "toy.json", [64, 32], counter, unwritable=unwritable)
        return
    done = run(tmp_path / "eval" / "toy.json", [64, 32], counter, unwritable=unwritable)
    assert counter.groups == 2 and len(done.entries) == 4 and done.not_saved


def test_every_task_reads_its_results_file(tmp_path: Path) -> None:
    for name, task in registry().items():  # tasks may share a results file: one directory each
        run_dir = tmp_path / name
        assert task.load_results(run_dir) is None
        path = run_dir / task.results_file
        eval_results.update_results_file(
            path, task.command, results_header("r", "rope", 8, 8), [], key=key, checkpoint=CKPT
        )
        assert task.load_results(run_dir)["entries"] == []
