"""The contract every registered evaluation task keeps (parametrised over the registry, so a new task is tested the
moment its file exists): on a tiny model it plans and measures cells, stores them in its results file keyed by the
checkpoint with the fields every entry has, reuses them on the next call, measures again after more training, and
refuses a run being trained. And the plug itself: a task written as one class (`EchoTask`, registered for one test)
is measured by what a sweep job calls, summarised after `compare`'s table (a sweep's end prints the same) and listed
by the API, with no other edit."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from typer.testing import CliRunner

from posenc_cli import __version__, api
from posenc_cli.cli import app
from posenc_cli.config import Config, EvalConfig, ModelConfig, TrainConfig
from posenc_cli.data.sources import registry as source_registry
from posenc_cli.data.sources.stdlib import StdlibDataConfig
from posenc_cli.data.tokenizer import ByteTokenizer
from posenc_cli.errors import CheckpointError, UserError
from posenc_cli.evaluation import tasks as tasks_package
from posenc_cli.evaluation.loop import COMMON_FIELDS, Entry
from posenc_cli.evaluation.results import checkpoint_identity, checkpoint_key
from posenc_cli.evaluation.tasks import registry
from posenc_cli.evaluation.tasks.base import EvalTask, Summary
from posenc_cli.model import GPT
from posenc_cli.positional import config_class
from posenc_cli.run.interrupts import run_lock
from posenc_cli.run.load import LoadedRun, load_run
from posenc_cli.run.meta import RunMeta

TRAIN_LEN = 128  # long enough for a passkey prompt at 1x


@pytest.fixture(params=sorted(registry()))
def task(request: pytest.FixtureRequest):
    return registry()[request.param]


def tiny_run(path: Path, step: int, sha: str) -> LoadedRun:
    torch.manual_seed(0)
    cfg = Config(
        model=ModelConfig(d_model=32, n_layer=1, n_head=2),
        pos=config_class("rope")(name="rope"),
        data=StdlibDataConfig(val_fraction=0.5),
        train=TrainConfig(seq_len=TRAIN_LEN),
        eval=EvalConfig(lengths=[1.0, 2.0], tokens=64),
    )
    model = GPT(cfg.model, cfg.pos, ByteTokenizer().vocab_size, TRAIN_LEN).eval()
    path.mkdir(parents=True, exist_ok=True)
    meta = {"kind": "posenc-run", "train_length": TRAIN_LEN, "step": step, "files": {"model.safetensors": sha}}
    (path / "meta.json").write_text(json.dumps(meta))
    return LoadedRun(path=path, model=model, config=cfg, meta=RunMeta.from_json(meta), tokenizer=ByteTokenizer())


def job_data(task, run: LoadedRun) -> LoadedRun:
    """The run as a sweep job of the task's own data source would have it: tasks whose cells are per instance length
    (`length_axis` "instance": the algorithmic suite) measure runs trained on that source, here two tiny settings."""
    if getattr(task, "length_axis", "tokens") == "tokens":
        return run
    (source,) = [s for s in source_registry().values() if task.name in s.tasks]
    data = source.config_cls(tasks=["copy"], max_length=2, eval_examples=2)  # type: ignore[call-arg]
    run.config = dataclasses.replace(run.config, data=data)
    return run


def test_task_measures_stores_and_reuses_cells_by_checkpoint(task, tmp_path: Path, fake_stdlib: Path) -> None:
    run = job_data(task, tiny_run(tmp_path / "run", 10, "a" * 64))
    cpu = torch.device("cpu")
    first = task.evaluate_job(run, run.config, device=cpu)
    cells = first["entries"]
    assert cells and first["reused"] == 0
    assert all(e["checkpoint"] == checkpoint_identity(run.meta) for e in cells)
    assert all(set(COMMON_FIELDS) <= set(e) and e["created"] for e in cells)  # stamped by the loop
    if getattr(task, "length_axis", "tokens") == "tokens":
        assert {e["length"] for e in cells} >= {TRAIN_LEN}  # lengths are multiples of the training length
    else:
        assert {e["length"] for e in cells} == {1, 2, 3, 4}  # instance lengths 1..2L
    stored = json.loads((run.path / task.results_file).read_text())
    assert stored["train_length"] == TRAIN_LEN and len(stored["entries"]) == len(cells)

    again = task.evaluate_job(run, run.config, device=cpu)
    assert again["reused"] == len(cells) and again["entries"] == cells  # no forward: the stored cells

    run.meta = dataclasses.replace(run.meta, step=20, files={"model.safetensors": "b" * 64})  # trained further
    later = task.evaluate_job(run, run.config, device=cpu)
    assert later["reused"] == 0
    stored = json.loads((run.path / task.results_file).read_text())
    assert {json.dumps(e["checkpoint"]) for e in stored["entries"]} == {json.dumps(checkpoint_identity(run.meta))}


def test_task_refuses_a_run_being_trained(task, tmp_path: Path, fake_stdlib: Path) -> None:
    run = tiny_run(tmp_path / "run", 10, "a" * 64)
    with run_lock(run.path), pytest.raises(CheckpointError, match="being trained"):
        task.evaluate_job(run, run.config, device=torch.device("cpu"))
    assert not (run.path / task.results_file).exists()


def test_every_task_is_run_by_some_source() -> None:
    used = {name for source in source_registry().values() for name in source.tasks}
    assert used == set(registry())


def test_a_randomized_position_run_is_fed_draws_from_its_range(task, tmp_path: Path, fake_stdlib: Path) -> None:
    """Every evaluation of a `train.random_positions=M` run feeds it sorted draws from [0, M), as Ruoss et al. do at
    test time, and its cells say so (and are keyed by it)."""
    run = job_data(task, tiny_run(tmp_path / "run", 10, "a" * 64))
    M = 4 * TRAIN_LEN
    run.config = dataclasses.replace(run.config, train=dataclasses.replace(run.config.train, random_positions=M))
    fed: list[torch.Tensor] = []
    forward = run.model.forward

    def recording(idx: torch.Tensor, **kw) -> torch.Tensor:
        fed.append(kw.get("position_ids"))
        return forward(idx, **kw)

    run.model.forward = recording  # type: ignore[method-assign]
    cells = task.evaluate_job(run, run.config, device=torch.device("cpu"))["entries"]
    layers = run.config.model.n_layer  # drawn per layer, as trained (train.random_positions_draw=layer)
    assert cells and all(e["positions"] == {"mode": "random", "range": M, "seed": 0, "layers": layers} for e in cells)
    assert all(ids is not None for ids in fed)
    if any(e["status"] == "ok" for e in cells):  # (the retrieval tasks' 128-token budget leaves no cell at 128)
        prompts = [ids.reshape(-1, ids.shape[-1]) for ids in fed if ids.shape[-1] > 1]  # whole windows / prompts
        assert prompts and all(int(ids.max()) < M and bool((ids.diff(dim=-1) > 0).all()) for ids in prompts)
        assert max(int(ids.max()) for ids in prompts) >= TRAIN_LEN  # sorted draws from [0, M), not 0..T-1


# ----------------------------------------------------------------------------------------------------------------
# The plug: a task written as one class (here, in this file) is measured by the loop a sweep job calls, summarised
# after a sweep's and `compare`'s table and listed by the API, with no edit anywhere else.


@dataclass(frozen=True, kw_only=True)
class EchoEntry(Entry):
    length: int
    checkpoint: dict[str, Any] = field(default_factory=dict)
    status: str = "n/a"
    reason: str | None = None
    score: float | None = None
    posenc_version: str = __version__
    created: str = ""


class EchoTask(EvalTask):
    """A toy task: one cell per multiple of the training length in `eval.lengths`, each scoring 1 without a forward."""

    name, command = "echo", "eval-echo"
    results_file: ClassVar[Path] = Path("eval") / "echo.json"

    def __init__(self, run: LoadedRun, lengths: list[int], *, device: Any = None, progress: Any = None) -> None:
        super().__init__(run, device=device, progress=progress)
        self.lengths = lengths

    @classmethod
    def for_job(cls, run: LoadedRun, cfg: Config, *, device: Any, progress: Any = None) -> EchoTask:
        _, base = run.meta.lengths(run.config)
        return cls(run, [round(m * base) for m in cfg.eval.lengths], device=device)

    def plan(self) -> list[list[EchoEntry]]:
        return [[EchoEntry(length=n)] for n in self.lengths]

    @staticmethod
    def key(e: dict[str, Any]) -> tuple[Any, ...]:
        return (e["length"], *checkpoint_key(e))

    def measure(self, group: Sequence[EchoEntry]) -> list[EchoEntry]:
        return [e.measured(score=1.0) for e in group]

    @classmethod
    def summarise(cls, results: Sequence[dict[str, Any]], **_: Any) -> Summary:
        cells = sum(len(r["entries"]) for r in results)
        return Summary(cls.name, list(results), tables=[f"echo summary: {len(results)} run(s), {cells} cells"])


@pytest.fixture
def echo(monkeypatch: pytest.MonkeyPatch) -> type[EchoTask]:
    """EchoTask registered for one test (as `@register` in its own file would)."""
    entries = registry()  # every task file imported first
    assert "echo" not in entries
    monkeypatch.setitem(tasks_package._TASKS._entries, "echo", EchoTask)
    return EchoTask


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plug") / "run"
    tiny = ["model=tiny", "model.d_model=16", "model.n_layer=1", "model.n_head=2", "train.seq_len=64"]
    args = ["train", *tiny, "train.steps=1", "train.batch_size=2", "train.threads=1", "--out", str(path)]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    return path


def test_a_new_task_in_one_file_shows_up_everywhere(echo: type[EchoTask], trained: Path) -> None:
    assert registry()["echo"] is echo  # the registry lists it
    shutil.rmtree(trained / "eval", ignore_errors=True)
    with pytest.raises(UserError, match="no stored task cells"):  # an unevaluated run is refused, not an empty list
        api.task_summaries([trained])
    run = load_run(trained, device="cpu")
    cfg = dataclasses.replace(run.config, eval=EvalConfig(lengths=[1.0, 2.0]))
    done = echo.evaluate_job(run, cfg, device=torch.device("cpu"))  # what a sweep job calls for its source's tasks
    assert [e["status"] for e in done["entries"]] == ["ok", "ok"] and set(COMMON_FIELDS) <= set(done["entries"][0])
    assert echo.evaluate_job(run, cfg, device=torch.device("cpu"))["reused"] == 2  # stored, then reused
    (summary,) = [s for s in api.task_summaries([trained]) if s.task == "echo"]  # the API
    assert summary.results[0]["path"] == str(trained) and len(summary.results[0]["entries"]) == 2
    shown = CliRunner().invoke(app, ["compare", str(trained)], terminal_width=200)  # compare (and a sweep's end)
    assert shown.exit_code == 0, shown.output
    assert "echo summary: 1 run(s), 2 cells" in shown.output


def test_every_task_is_a_whole_plug(task: type[EvalTask]) -> None:
    """Each registered task answers what the loop, a sweep job and a summary ask, beyond the base class."""
    for method in ("plan", "measure", "key", "for_job"):
        assert getattr(task, method) is not getattr(EvalTask, method), f"{task.name} lacks {method}"
    assert task.name and task.command.startswith("eval-") and task.results_file.suffix == ".json"
